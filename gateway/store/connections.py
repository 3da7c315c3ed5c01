"""The request path's Redis connections: a few, shared by every request, pipelined.

A turn makes two round trips, each a script call and a few commands. Each call's commands
go out on one of a few long-lived connections, in one write with the other calls of the
same loop turn, and the call waits for its replies, which Redis sends in the order the
commands arrived; the connection's protocol parses replies as they arrive and hands each
caller its own. Many concurrent requests share a connection without waiting for each
other's round trips.

Why not redis-py's pool and pipeline: through them one round trip cost ~115 µs of
gateway CPU (hot caches, the 2-core machine), here ~35 µs; and a burst of requests had to
wait for a free connection, or open one (a connect and a handshake), one loop turn after
another: in a 256-stream burst, loads queued behind the pool passed the 100 ms deadline
(degraded answers) while Redis sat mostly idle. Here a burst's calls are all written in
the same loop turn and read back together.

redis-py still connects (TLS, unix sockets, AUTH, SELECT, its protocol handshake) and
hands over its transport; hiredis packs the commands (in C: ~6 µs for a turn's record
call, ~50 µs in redis-py's Python packer, the same bytes) and parses the replies, with
redis-py's error classes. Replies come back as Redis sent them (no response callbacks);
an error reply is returned in its place.

The deadline (``execute``'s ``timeout_s``) bounds how long Redis may stay silent, not how
long a call waits. A call fails when nothing has come from Redis on its connection for
``timeout_s`` since it was written: a black-holed or stalled Redis degrades requests in
``timeout_s``. A Redis that keeps answering the calls queued ahead of it (a burst: 1,024
streams' loads written in one loop turn take Redis ~100 ms to run) lets the call wait up
to ``max_queued_s`` longer. Replies are parsed where they arrive (the protocol's
``data_received``, in the loop's I/O phase, before its timers run), so a reply that came
while the loop was busy with other requests is in hand when the deadline is checked: the
loop's own lateness is never counted against Redis. (With a reader task and redis-py's
stream, replies waited in the stream's buffer behind a busy loop: a 1,024-stream hold
degraded 115 answers of 3,478 with Redis answering every ping within 3 ms.)

Notes:
    A caller that gives up (its deadline, its client gone) leaves its entry in the queue:
    its replies are still read, and dropped, so the next caller's replies stay its own.
    That connection is slow, though, and every new call on it would wait behind those
    replies: it takes no new calls (it "drains"), and is closed once its last reply is
    read; new calls go to the other connections, or to a new one.
    A connection that fails or is closed by the server (a Redis restart) fails every
    caller waiting on it (they degrade) and is replaced on the next call; the protocol
    notices a close while idle, so a restart costs no command.
    Connecting is shared by the callers that need the connection and is not cancelled
    when one of them gives up.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import hiredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.compat import redis as compat_redis

# Enough to spread reply parsing over a few sockets; Redis runs one command at a time.
LINKS = 4
# How much longer than its deadline a call may wait while Redis keeps answering the calls
# queued ahead of it on its connection; past it, the call fails however busy Redis is.
MAX_QUEUED_S = 1.0
_INCOMPLETE = object()  # hiredis: no whole reply buffered yet


@dataclass(slots=True)
class _Waiting:
    """One call's place in a connection's queue."""

    future: asyncio.Future[list[Any]]
    expected: int
    timeout_s: float | None  # the deadline (None: the caller's own)
    written_at: float = 0.0  # time.monotonic(), once written
    replies: list[Any] = field(default_factory=list)
    deadline: asyncio.TimerHandle | None = None


class _Link(asyncio.Protocol):
    """One connection, once open its transport's protocol, and the calls waiting for
    replies, in order."""

    def __init__(self, connection: Any, max_queued_s: float) -> None:
        self.connection = connection
        self.max_queued_s = max_queued_s
        self.queue: deque[_Waiting] = deque()
        self.failed: BaseException | None = None
        self.transport: asyncio.Transport | None = None
        self.parser: Any = None  # hiredis.Reader, once open
        self._stream_protocol: asyncio.BaseProtocol | None = None  # redis-py's, replaced
        # When bytes last came from Redis (time.monotonic()): the deadline's clock. The
        # loop's clock is not used: uvloop's stands still while a loop turn runs.
        self.heard_at = 0.0
        self.closing: asyncio.Task[None] | None = None
        self.unsent: list[tuple[bytes, _Waiting]] = []  # this loop turn's calls (see send)
        self.draining = False  # takes no new calls; closed when its queue is empty
        self.ready: asyncio.Future[None] = asyncio.ensure_future(self._open())
        self.ready.add_done_callback(self._opened)

    async def _open(self) -> None:
        connection = self.connection
        await connection.connect()
        # The handshake's replies are read; nothing else was asked, so nothing is
        # buffered. redis-py's connection keeps the transport (and closes it).
        # NOSCRIPT as NoScriptError, MOVED as MovedError: as redis-py has them.
        self.parser = compat_redis.reply_reader(connection, _INCOMPLETE)
        # redis-py's own protocol is told of the close (see connection_lost).
        self.transport, self._stream_protocol = compat_redis.take_transport(connection, self)

    def send(self, packed: bytes, waiting: _Waiting) -> None:
        """A call's commands, written with the other calls of this loop turn in one write.

        Under load many requests reach Redis in the same loop turn; one write (a system
        call, ~8 µs on loopback) each was ~3.5% of the gateway's CPU. The transport
        buffers what the socket does not take at once; each call's deadline bounds a Redis
        that stops reading.
        """
        if not self.unsent:
            asyncio.get_running_loop().call_soon(self._flush)
        self.unsent.append((packed, waiting))

    def _flush(self) -> None:
        unsent, self.unsent = self.unsent, []
        if self.failed is not None or self.transport is None:
            return  # its callers were failed with the connection
        try:
            self.transport.write(b"".join([packed for packed, _ in unsent]))
        except Exception as error:  # a write refused: where the stream stands is unknown
            self.fail(error)
            return
        # Each deadline runs from the write: a call is not late for the loop turn it
        # waited to be written in.
        now = time.monotonic()
        loop = asyncio.get_running_loop()
        for _, waiting in unsent:
            waiting.written_at = now
            if waiting.timeout_s is not None and not waiting.future.done():
                waiting.deadline = loop.call_later(
                    waiting.timeout_s, self.expire_unless_heard, waiting
                )

    def data_received(self, data: bytes) -> None:
        self.heard_at = time.monotonic()
        parser = self.parser
        parser.feed(data)
        try:
            reply = parser.gets()
            while reply is not _INCOMPLETE and self.failed is None:
                self._take(reply)
                reply = parser.gets()
        except Exception as error:  # a protocol error: where the stream stands is unknown
            self.fail(error)

    def _take(self, reply: Any) -> None:
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

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(exc or RedisConnectionError("connection closed"))
        # redis-py's stream waits for the close it started (``disconnect``).
        if self._stream_protocol is not None:
            self._stream_protocol.connection_lost(exc)

    def expire_unless_heard(self, waiting: _Waiting) -> None:
        """The call's deadline: it fails once Redis has been silent on this connection for
        its ``timeout_s`` since it was written, or it has waited ``max_queued_s`` more."""
        waiting.deadline = None
        if waiting.future.done() or waiting.timeout_s is None:
            return
        now = time.monotonic()
        quiet_since = max(waiting.written_at, self.heard_at)
        due = min(
            quiet_since + waiting.timeout_s,
            waiting.written_at + waiting.timeout_s + self.max_queued_s,
        )
        if now < due:  # Redis answered the calls ahead: this one is queued, not lost
            waiting.deadline = asyncio.get_running_loop().call_later(
                due - now, self.expire_unless_heard, waiting
            )
        else:
            waited_ms = (now - waiting.written_at) * 1000
            silent_ms = (now - quiet_since) * 1000
            waiting.future.set_exception(
                TimeoutError(f"no reply in {waited_ms:.0f} ms (redis silent {silent_ms:.0f} ms)")
            )

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
    one is made), without a socket timeout of their own: each call's deadline bounds it.
    ``pool`` itself (a pool, or a cluster's node) is never checked out from."""

    def __init__(
        self, pool: ConnectionFactory, links: int = LINKS, *, max_queued_s: float = MAX_QUEUED_S
    ) -> None:
        self._pool = pool
        self._size = links
        self._max_queued_s = max_queued_s
        self._links: list[_Link] = []  # taking new calls
        self._draining: list[_Link] = []  # closed once read to the end
        self._turn = itertools.count()

    async def execute(
        self, commands: Sequence[tuple[Any, ...]], timeout_s: float | None = None
    ) -> list[Any]:
        """Sends the commands (in this loop turn's write) and returns their replies, in order.

        ``timeout_s``: the deadline (see the module's notes); ``TimeoutError`` past it.
        None: the caller bounds the call.
        """
        link = await self._link(timeout_s)
        packed = b"".join(map(hiredis.pack_command, commands))
        loop = asyncio.get_running_loop()
        waiting = _Waiting(loop.create_future(), len(commands), timeout_s)
        # The queue's order is the order of the commands on the wire.
        link.queue.append(waiting)
        link.send(packed, waiting)
        try:
            return await waiting.future
        except (asyncio.CancelledError, TimeoutError):
            if waiting in link.queue:  # given up with replies still to come
                self._drain(link)
            raise
        finally:
            if waiting.deadline is not None:
                waiting.deadline.cancel()

    async def per_server(
        self, commands: Sequence[tuple[Any, ...]], timeout_s: float | None = None
    ) -> None:
        """The commands once on the server (loading the scripts); error replies raise."""
        for reply in await self.execute(commands, timeout_s):
            if isinstance(reply, Exception):
                raise reply

    async def warm(self, timeout_s: float | None = None) -> None:
        """Every link open, so that a burst of first calls does not wait for connects."""
        await asyncio.gather(*(self.execute([("PING",)], timeout_s) for _ in range(self._size)))

    def _drain(self, link: _Link) -> None:
        link.drain()
        if link in self._links:
            self._links.remove(link)
            self._draining.append(link)

    async def _link(self, timeout_s: float | None) -> _Link:
        self._links = [link for link in self._links if link.usable]
        self._draining = [link for link in self._draining if link.failed is None]
        if len(self._links) < self._size:
            link = _Link(self._new(), self._max_queued_s)
            self._links.append(link)
        else:
            link = self._links[next(self._turn) % len(self._links)]
        if not link.ready.done():
            try:
                # A caller giving up does not stop the connect.
                await asyncio.wait_for(asyncio.shield(link.ready), timeout_s)
            except (asyncio.CancelledError, TimeoutError):
                self._drain(link)  # slow to connect: not for the next calls either
                raise
        link.ready.result()
        if link.failed is not None or link.transport is None or link.transport.is_closing():
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
            if link.closing is not None:
                await asyncio.gather(link.closing, return_exceptions=True)
            await link.connection.disconnect()
