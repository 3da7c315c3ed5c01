"""The request path's Redis connections: redis-py's ``Connection``, pooled plainly.

A turn makes two round trips, each a pipeline of a script call and a few commands.
Through redis-py 8's pipeline and blocking pool one cost ~115 µs of gateway CPU
(measured on the 2-core machine, hot caches); on a connection taken from a plain deque
it costs ~40 µs. The difference is bookkeeping this path does not use: the pool's
lock, connection-count metrics and event dispatch, the pipeline's reset (a task), its
retry wrapper and response callbacks, and a timeout task around every send (the store
puts its own deadline around the whole call).

Commands are still built by redis-py (a pipeline's command stack), packed by hiredis
(in C: ~6 µs for a turn's record call, ~50 µs in redis-py's Python packer, the same
bytes), sent and parsed by redis-py's ``Connection`` and hiredis; replies come back as
Redis sent them (no callbacks).

Notes:
    A connection is checked before use exactly as redis-py's pool checks it: one the
    server closed (a Redis restart) or with unread data is reconnected first, so a
    restart costs no failed command. A call interrupted half-way (its deadline passed,
    its client left) may leave a reply unread: that connection is closed, not reused.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.asyncio as redis
from redis.exceptions import ResponseError


class Connections:
    """Connections like ``pool``'s (the same class, server and settings, read when one
    is made), but no socket timeout of their own: the store's deadline bounds each call.
    At most the pool's ``max_connections``; callers beyond that wait for one."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self._pool = pool
        self._idle: deque[Any] = deque()
        self._slots = asyncio.Semaphore(pool.max_connections)
        self._all: set[Any] = set()

    async def execute(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Sends the commands in one write and reads their replies; a command's error
        reply is returned in its place, not raised."""
        async with self._slots:
            connection = self._idle.pop() if self._idle else self._new()
            try:
                await connection.connect()  # no-op when connected
                if await connection.can_read():  # closed by the server, or dirty
                    await connection.disconnect()
                    await connection.connect()
                packed = b"".join(map(hiredis.pack_command, commands))
                await connection.send_packed_command(packed, check_health=False)
                replies: list[Any] = []
                for _ in commands:
                    try:
                        replies.append(await connection.read_response())
                    except ResponseError as error:
                        replies.append(error)
            except BaseException:
                # redis-py closes a connection whose read was interrupted; a send cut
                # short, or anything else, must not leave a half-used one either.
                await connection.disconnect(nowait=True)
                raise
            finally:
                self._idle.append(connection)
            return replies

    def _new(self) -> Any:
        kwargs = {**self._pool.connection_kwargs, "socket_timeout": None}
        connection = self._pool.connection_class(**kwargs)
        self._all.add(connection)
        return connection

    async def aclose(self) -> None:
        for connection in self._all:
            await connection.disconnect()
        self._all.clear()
        self._idle.clear()
