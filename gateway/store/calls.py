"""What every part of the store stands on: ``StoreCalls``, the round trips on the link
(``link.py``) under a deadline, the scripts, and the one failure callers see
(``StoreUnavailable``). Private to ``gateway.store``: callers above hold the parts.

Every call runs under a deadline (``redis.timeout_ms`` on the request path): redis-py's
own defaults take seconds to notice a dead server, and the gateway must answer first. A
missed deadline or any connection error surfaces as ``StoreUnavailable``; the caller
decides between fail-open and fail-closed. Key shapes live in ``keys.py``, the scripts
in ``scripts/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import redis.asyncio as redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, OutOfMemoryError, RedisClusterException, RedisError
from redis.maint_notifications import MaintNotificationsConfig

from gateway.observability import metrics
from gateway.store import scripts
from gateway.store.link import Command, RedisLink

T = TypeVar("T")


class StoreUnavailable(Exception):
    """Redis did not answer in time, or answered with an error."""


class StoreFull(StoreUnavailable):
    """Redis refused a write for want of memory (``maxmemory`` reached, ``noeviction``):
    not worth retrying a moment later."""


def refused(reply: Exception) -> StoreUnavailable:
    """What an error reply is to the store's callers."""
    kind = StoreFull if isinstance(reply, OutOfMemoryError) else StoreUnavailable
    return kind(f"redis: {type(reply).__name__}: {reply}")


def create_client(
    url: str, *, timeout_s: float, max_connections: int, cluster: bool = False
) -> redis.Redis | RedisCluster:
    """A client that fails within the deadline instead of redis-py's seconds of retries;
    with ``cluster``, a Redis Cluster client seeded by ``url`` (any node of the cluster).

    A blocking pool waits for a free connection instead of raising "Too many connections"
    under load; the deadline around each call bounds that wait too. (A cluster client
    keeps a pool per node, which raises instead: off the request path, it is sized by
    ``max_connections`` per node.)

    Maintenance notifications are off: redis-py 8 defaults them to "auto", which its pool
    takes as on, and then skips the check that finds a pooled connection the server closed.
    After a Redis restart every pooled connection would then fail one command (a degraded
    turn each) instead of reconnecting before use. Retrying instead is not safe: a retried
    append could land twice.
    """
    common: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
        # No CLIENT SETINFO on connect: a new connection is a TCP connect, not a
        # connect and a round trip. Bursts open many at once, each within the deadline.
        "driver_info": None,
    }
    if cluster:
        return RedisCluster.from_url(url, max_connections=max_connections, **common)
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout_s,
        maint_notifications_config=MaintNotificationsConfig(enabled=False),
        **common,
    )
    return redis.Redis(connection_pool=pool)


# The scripts a store calls by their sha (``EVALSHA``), loaded into each server at start
# and again after a restart emptied its script cache.
SCRIPTS = (
    "load",
    "archive_page",
    "record",
    "write_tiers",
    "job_head",
    "fail_job",
    "release",
    "end",
    "save_vectors",
    "release_usage",
    "quota_reserve",
    "quota_settle",
    "change_key",
    "admit",
    "limit_reserve",
)


def pairs(reply: Any) -> dict[Any, Any]:
    """A map reply (``HGETALL``): a dict in RESP3, a flat list of keys and values in RESP2."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


def scored(reply: Any) -> list[tuple[Any, float]]:
    """Members with their scores (``WITHSCORES``): pairs in RESP3, a flat list in RESP2."""
    if reply and isinstance(reply[0], list):
        return [(member, float(score)) for member, score in reply]
    return [(member, float(score)) for member, score in zip(reply[::2], reply[1::2], strict=True)]


class Channel:
    """A redis-py client and a link whose connections are made like the client's own."""

    def __init__(self, client: redis.Redis | RedisCluster, link: RedisLink | None = None) -> None:
        self.client = client
        self.link = link if link is not None else RedisLink(client)


class _Channels:
    """The request path's client and link and the background's (the worker, the memory
    API, the admin keys' watch), owned together and closed once.

    Apart, because Redis answers each connection in order: a background call that takes
    long (an export's read of a long log, a 64 MB value) would hold up the request-path
    calls written behind it on the same connection, and one given up would drain one of
    the request path's few connections. The clients differ too: the request path's
    connects within its deadline, the background's waits out a blocking stream read.
    """

    def __init__(self, request: Channel, background: Channel) -> None:
        self.request = request
        self.background = background
        self._closing: asyncio.Task[None] | None = None

    async def close(self) -> None:
        """Both links and both clients (one, when both channels share it) closed, once
        however many views ask."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        clients = [self.request.client]
        if self.background.client is not self.request.client:
            clients.append(self.background.client)
        for client in clients:
            await client.aclose()
            if not isinstance(client, RedisCluster):
                # A pool passed in explicitly is not closed by the client: its sockets too.
                await client.connection_pool.disconnect()
        await self.request.link.aclose()
        await self.background.link.aclose()


# What a call to Redis can fail with, all of it ``StoreUnavailable`` to the store's callers.
# RedisClusterException is not a RedisError: redis-py raises it for a cluster it cannot
# reach at all (no node answered its slots query), at start-up or a first call.
_UNAVAILABLE = (TimeoutError, RedisError, RedisClusterException, OSError)


@contextlib.contextmanager
def _redis_call(op: str | None) -> Iterator[None]:
    """A call to Redis: its failure raised as ``StoreUnavailable``; with ``op``, its time
    observed in the metrics under that name."""
    started = time.perf_counter()
    try:
        yield
    except _UNAVAILABLE as error:
        raise StoreUnavailable(f"redis: {type(error).__name__}: {error}") from error
    finally:
        if op is not None:
            metrics.redis_op(op, started)


class StoreCalls:
    """The client, the link, the deadline and the scripts every part of the store
    (``redis_store``) makes its calls through.

    The request path's client and link, under its deadline (100 ms). ``with_deadline``
    gives the background's (the worker, the memory API: calls that may take seconds):
    another client and link, other connections, shared by every such view.
    """

    def __init__(
        self,
        client: redis.Redis | RedisCluster,
        *,
        timeout_s: float,
        retention_s: int,
        job_shards: int = 1,
        link: RedisLink | None = None,
        background: redis.Redis | RedisCluster | None = None,
        background_link: RedisLink | None = None,
    ) -> None:
        """``client`` and ``link`` (default: one made like ``client``): the request
        path's. ``background`` and ``background_link``: the ``with_deadline`` views'; by
        default ``client``, and a link of their own over it (other connections)."""
        request = Channel(client, link)
        background_client = background if background is not None else client
        self._init(
            _Channels(request, Channel(background_client, background_link)),
            request,
            timeout_s=timeout_s,
            retention_s=retention_s,
            job_shards=job_shards,
        )

    def _init(
        self,
        channels: _Channels,
        channel: Channel,
        *,
        timeout_s: float,
        retention_s: int,
        job_shards: int,
    ) -> None:
        self._channels = channels
        # redis-py's client: the link's connections are made like its own; the worker's
        # blocking stream reads and the start-up's CONFIG and INFO use it directly.
        self.client: Any = channel.client
        self.link = channel.link
        self.job_shards = job_shards
        self.timeout_s = timeout_s
        self.retention_s = retention_s
        self._shas = {name: scripts.sha(name) for name in SCRIPTS}

    def with_deadline(self, timeout_s: float) -> StoreCalls:
        """The background's client and link (every view shares them), with ``timeout_s``
        as the calls' deadline."""
        view = StoreCalls.__new__(StoreCalls)
        view._init(
            self._channels,
            self._channels.background,
            timeout_s=timeout_s,
            retention_s=self.retention_s,
            job_shards=self.job_shards,
        )
        return view

    def script(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Command:
        """The command that runs script ``name`` (one of ``SCRIPTS``)."""
        return ("EVALSHA", self._shas[name], len(keys), *keys, *args)

    async def execute(
        self,
        commands: Sequence[Command],
        *,
        op: str,
        needed: int | None = None,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """One round trip on the link under the store's deadline (``timeout_s``: another);
        ``op`` names the operation in the metrics. Replies are as Redis sent them.

        A server that lost its script cache (a restart) ran nothing of a failed script:
        the scripts are loaded and all the commands sent again. The other commands sent
        with a script must therefore be safe to repeat.

        A missed deadline or a lost connection raises ``StoreUnavailable``; so does an
        error reply among the first ``needed`` commands (None: all of them). Past those
        it is returned in its place (on a cluster, they may have gone to another master
        than the session's, which may be down while the session's is not).
        """
        deadline = timeout_s or self.timeout_s
        replies = await self._round_trip(commands, op, deadline)
        if any(isinstance(reply, NoScriptError) for reply in replies) and self._calls_ours(
            commands
        ):
            await self._load_scripts(deadline)
            replies = await self._round_trip(commands, op, deadline)
        for reply in replies if needed is None else replies[:needed]:
            if isinstance(reply, Exception):
                raise refused(reply)
        return replies

    async def _round_trip(self, commands: Sequence[Command], op: str, deadline: float) -> list[Any]:
        with _redis_call(op):
            return await self.link.execute(commands, deadline=deadline, op=op)

    def _calls_ours(self, commands: Sequence[Command]) -> bool:
        shas = self._shas.values()
        return any(command[0] == "EVALSHA" and command[1] in shas for command in commands)

    async def bounded(
        self,
        call: Callable[[], Awaitable[T]],
        *,
        op: str,
        timeout_s: float | None = None,
    ) -> T:
        """A call through redis-py's client (off the request path: the worker's blocking
        stream reads, CONFIG and INFO at start-up) under ``asyncio.timeout``; its failure
        is ``StoreUnavailable``. ``op`` names the operation in the metrics."""
        with _redis_call(op):
            async with asyncio.timeout(timeout_s or self.timeout_s):
                return await call()

    async def warm(self, timeout_s: float | None = None) -> None:
        """Start-up: the scripts loaded and the link's connections open, so that a burst
        of first requests pays for neither inside its deadline."""
        await self._load_scripts(timeout_s)
        with _redis_call(None):
            await self.link.warm(deadline=timeout_s or self.timeout_s)

    async def _load_scripts(self, timeout_s: float | None = None) -> None:
        """Into an emptied script cache (a restart, SCRIPT FLUSH, a replica promoted in a
        cluster: scripts are not replicated), one round trip to each server."""
        commands = [("SCRIPT", "LOAD", scripts.source(name)) for name in SCRIPTS]
        with _redis_call("load_scripts"):
            await self.link.per_server(
                commands, deadline=timeout_s or self.timeout_s, op="load_scripts"
            )

    async def close(self) -> None:
        """Both channels' clients and links (shared by every view), closed once."""
        await self._channels.close()
