"""The request path's Redis connections: a few, shared by every request, pipelined.

A turn makes two round trips, each a script call and a few commands. Each call writes
its commands at once on one of a few long-lived connections and waits for its replies,
which Redis sends in the order the commands arrived; one reader task per connection
hands each caller its own. Many concurrent requests share a connection without waiting
for each other's round trips.

Why not redis-py's pool and pipeline: through them one round trip cost ~115 µs of
gateway CPU (hot caches, the 2-core machine), here ~35 µs; and a burst of requests had to
wait for a free connection, or open one (a connect and a handshake), one loop turn after
another: in a 256-stream burst, loads queued behind the pool passed the 100 ms deadline
(degraded answers) while Redis sat mostly idle. Here a burst's calls are all written in
the same loop turn and read back together.

redis-py still connects (TLS, unix sockets, AUTH, SELECT, its protocol handshake) and
reads and parses replies (hiredis); hiredis packs the commands (in C: ~6 µs for a turn's
record call, ~50 µs in redis-py's Python packer, the same bytes). Replies come back as
Redis sent them (no response callbacks); an error reply is returned in its place.

Notes:
    A caller that gives up (its deadline, its client gone) leaves its entry in the queue:
    its replies are still read, and dropped, so the next caller's replies stay its own.
    That connection is slow, though, and every new call on it would wait behind those
    replies: it takes no new calls (it "drains"), and is closed once its last reply is
    read; new calls go to the other connections, or to a new one.
    A write cut short, or a connection that fails or is closed by the server (a Redis
    restart), fails every caller waiting on it (they degrade) and is replaced on the
    next call; the reader notices a close while idle, so a restart costs no command.
    Connecting is shared by the callers that need the connection and is not cancelled
    when one of them gives up.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import hiredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

# Enough to spread reply parsing over a few sockets; Redis runs one command at a time.
LINKS = 4


@dataclass
class _Waiting:
    """One call's place in a connection's queue."""

    future: asyncio.Future[list[Any]]
    expected: int
    replies: list[Any] = field(default_factory=list)


class _Link:
    """One connection, its reader task, and the calls waiting for replies, in order."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.queue: deque[_Waiting] = deque()
        self.failed: BaseException | None = None
        self.reader: asyncio.Task[None] | None = None
        self.closing: asyncio.Task[None] | None = None
        self.draining = False  # takes no new calls; closed when its queue is empty
        self.ready: asyncio.Future[None] = asyncio.ensure_future(self._open())
        self.ready.add_done_callback(self._opened)

    async def _open(self) -> None:
        await self.connection.connect()
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            while True:
                try:
                    reply = await self.connection.read_response()
                except ResponseError as error:  # an error reply: the connection is fine
                    reply = error
                if not self.queue:
                    raise RedisConnectionError("a reply nobody asked for")
                waiting = self.queue[0]
                waiting.replies.append(reply)
                if len(waiting.replies) == waiting.expected:
                    self.queue.popleft()
                    if not waiting.future.done():  # not given up
                        waiting.future.set_result(waiting.replies)
                    if self.draining and not self.queue:
                        self.fail(RedisConnectionError("drained"))  # nobody is left to fail
                        return
        except asyncio.CancelledError:
            self.fail(RedisConnectionError("connection closed"))
            raise
        except Exception as error:
            self.fail(error)

    def _opened(self, ready: asyncio.Future[None]) -> None:
        if ready.cancelled() or ready.exception() is not None:  # the caller who waited sees it
            self.failed = self.failed or RedisConnectionError("could not connect")
        elif self.draining and not self.queue:
            self.fail(RedisConnectionError("drained"))

    def drain(self) -> None:
        """Take no new calls; close once the replies still owed are read."""
        self.draining = True
        if self.ready.done() and not self.queue:
            self.fail(RedisConnectionError("drained"))

    def fail(self, error: BaseException) -> None:
        """The connection is unusable: its callers get the error, it is closed."""
        if self.failed is None:
            self.failed = error
        while self.queue:
            waiting = self.queue.popleft()
            if not waiting.future.done():
                waiting.future.set_exception(
                    RedisConnectionError(f"redis connection lost: {error}")
                )
        if self.reader is not None and self.reader is not asyncio.current_task():
            self.reader.cancel()
        if self.closing is None:
            self.closing = asyncio.ensure_future(self.connection.disconnect(nowait=True))

    @property
    def usable(self) -> bool:
        """Open (or opening) and taking new calls."""
        if self.draining or self.failed is not None:
            return False
        return not (self.ready.done() and self.ready.exception())


class ConnectionFactory(Protocol):
    """How a pool (or a cluster node) makes its connections."""

    @property
    def connection_class(self) -> type[AbstractConnection]: ...

    @property
    def connection_kwargs(self) -> dict[str, Any]: ...


class Connections:
    """``LINKS`` connections like ``pool``'s (the same class, server and settings, read when
    one is made), without a socket timeout of their own: the store's deadline bounds each
    call. ``pool`` itself (a pool, or a cluster's node) is never checked out from."""

    def __init__(self, pool: ConnectionFactory, links: int = LINKS) -> None:
        self._pool = pool
        self._size = links
        self._links: list[_Link] = []  # taking new calls
        self._draining: list[_Link] = []  # closed once read to the end
        self._turn = itertools.count()

    async def execute(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Sends the commands in one write and returns their replies, in order."""
        link = await self._link()
        loop = asyncio.get_running_loop()
        waiting = _Waiting(loop.create_future(), len(commands))
        packed = b"".join(map(hiredis.pack_command, commands))
        # No await between joining the queue and the write (the connection is open):
        # the queue's order is the order of the commands on the wire.
        link.queue.append(waiting)
        try:
            await link.connection.send_packed_command(packed, check_health=False)
        except BaseException as error:  # a write cut short: where the stream stands is unknown
            link.fail(error)
            raise
        try:
            return await waiting.future
        except asyncio.CancelledError:
            if waiting in link.queue:  # given up with replies still to come
                self._drain(link)
            raise

    async def per_server(self, commands: Sequence[tuple[Any, ...]]) -> None:
        """The commands once on the server (loading the scripts); error replies raise."""
        for reply in await self.execute(commands):
            if isinstance(reply, Exception):
                raise reply

    async def warm(self) -> None:
        """Every link open, so that a burst of first calls does not wait for connects."""
        await asyncio.gather(*(self.execute([("PING",)]) for _ in range(self._size)))

    def _drain(self, link: _Link) -> None:
        link.drain()
        if link in self._links:
            self._links.remove(link)
            self._draining.append(link)

    async def _link(self) -> _Link:
        self._links = [link for link in self._links if link.usable]
        self._draining = [link for link in self._draining if link.failed is None]
        if len(self._links) < self._size:
            link = _Link(self._new())
            self._links.append(link)
        else:
            link = self._links[next(self._turn) % len(self._links)]
        if not link.ready.done():
            try:
                await asyncio.shield(link.ready)  # a caller giving up does not stop the connect
            except asyncio.CancelledError:
                self._drain(link)  # slow to connect: not for the next calls either
                raise
        link.ready.result()
        if link.failed is not None or not link.connection.is_connected:
            link.fail(link.failed or RedisConnectionError("connection closed"))
            raise RedisConnectionError(f"redis connection lost: {link.failed}")
        return link

    def _new(self) -> Any:
        return self._pool.connection_class(
            **{**self._pool.connection_kwargs, "socket_timeout": None}
        )

    async def aclose(self) -> None:
        links, self._links, self._draining = self._links + self._draining, [], []
        for link in links:
            if not link.ready.done():
                link.ready.cancel()
            if link.reader is not None:
                link.reader.cancel()
                await asyncio.gather(link.reader, return_exceptions=True)
            if link.closing is not None:
                await asyncio.gather(link.closing, return_exceptions=True)
            await link.connection.disconnect()
