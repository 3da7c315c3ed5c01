"""The Redis store: small parts, one concern each, over a request and a background link.

- ``sessions``: the request path's load and record, a session's messages, vectors,
  images, tiers (compare-and-set), pins, end and erasure;
- ``quotas``: a tenant's storage quota, reserved before a write (a turn's in its load);
- ``users``: a user's session index, history and profile;
- ``queue``: the job stream, its consumer group, the sessions' leases, the backlog;
- ``server``: PING, CONFIG and INFO, the tenant secret;
- ``limits``: the rate limits' counters; ``ui``: the inspector's logins;
- ``gateway_keys``: the keys made through the admin API; ``catalog``: what an operator
  browses (tenants, sessions, receipts).

Under them, ``calls`` (private to the store): the clients, the links every call goes
through (``link``: the request path's, and the background's, other connections), the
deadline (``StoreUnavailable``) and the scripts; ``codecs``: the
scripts' typed arguments and replies; ``keys``: every key; ``tiers_cache`` and
``parsed_messages``: the parses the store keeps. Callers above the store
depend on the parts' Protocols (``gateway.service.ports``) and import its types from here.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from gateway.store.calls import StoreCalls, StoreFull, StoreUnavailable, create_client
from gateway.store.catalog import Catalog
from gateway.store.codecs import Known, LogSlice, Predicted, Recorded
from gateway.store.gateway_keys import GatewayKeys
from gateway.store.inspector_logins import InspectorLogins
from gateway.store.limits import LimitCounters
from gateway.store.link import RedisLink
from gateway.store.parsed_messages import ParsedMessages
from gateway.store.queue import STREAM_MAXLEN, JobNotice, JobQueue
from gateway.store.quota import Ask, Held, Quotas, Reservation
from gateway.store.redis_server import RedisServer
from gateway.store.sessions import Loaded, SessionOwned, Sessions, TailMoved
from gateway.store.tiers_cache import TiersCache
from gateway.store.users import IDLE_BATCH, Joining, Users

__all__ = [
    "IDLE_BATCH",
    "STREAM_MAXLEN",
    "Ask",
    "Held",
    "JobNotice",
    "Joining",
    "Known",
    "Loaded",
    "LogSlice",
    "Predicted",
    "Recorded",
    "RedisStore",
    "Reservation",
    "SessionOwned",
    "StoreFull",
    "StoreUnavailable",
    "TailMoved",
    "create_client",
]


class RedisStore:
    """Session memory in Redis: its parts over the request path's client and link, every
    call bounded by a deadline (``timeout_s``). ``with_deadline`` gives the same store
    for background calls (the worker, the memory API): another deadline, over the
    background's client and link, so that its long calls never hold up a request's."""

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        timeout_s: float,
        retention_s: int,
        job_shards: int = 1,
        link: RedisLink | None = None,
        background: Redis | RedisCluster | None = None,
        background_link: RedisLink | None = None,
    ) -> None:
        """``link``: the link to send on (a test's counting one); by default, one made
        as ``client`` makes its connections. ``background`` and ``background_link``: the
        ``with_deadline`` views' client and link; by default ``client`` and a link of
        their own over it (other connections than the request path's)."""
        calls = StoreCalls(
            client,
            timeout_s=timeout_s,
            retention_s=retention_s,
            job_shards=job_shards,
            link=link,
            background=background,
            background_link=background_link,
        )
        self._compose(calls, TiersCache(), ParsedMessages())

    def _compose(self, calls: StoreCalls, tiers: TiersCache, parsed: ParsedMessages) -> None:
        # The parses it keeps (tiers documents, stored messages) are this store's: each
        # app, and each test, starts with none.
        self._calls = calls
        self._tiers = tiers
        self._parsed = parsed
        self.users = Users(calls)
        self.sessions = Sessions(calls, self.users, tiers, parsed)
        self.quotas = Quotas(calls)
        self.queue = JobQueue(calls)
        self.server = RedisServer(calls)
        self.limits = LimitCounters(calls)
        self.ui = InspectorLogins(calls)
        self.gateway_keys = GatewayKeys(calls)
        self.catalog = Catalog(calls)

    def with_deadline(self, timeout_s: float) -> RedisStore:
        """This store (its parsed tiers and messages, and what it closes) over the
        background's client and link, with ``timeout_s`` as its calls' deadline: the
        worker's and the memory API's, seconds where a turn's is 100 ms. Every view shares
        that one link."""
        other = RedisStore.__new__(RedisStore)
        other._compose(self._calls.with_deadline(timeout_s), self._tiers, self._parsed)
        return other

    @property
    def client(self) -> Redis | RedisCluster:
        """redis-py's client (the CLI's ``--connect`` checks, tests' direct reads)."""
        client: Redis | RedisCluster = self._calls.client
        return client

    async def warm(self, timeout_s: float | None = None) -> None:
        """Start-up: the scripts loaded and the link's connections open, so that a burst
        of first requests pays for neither inside its deadline."""
        await self._calls.warm(timeout_s)

    async def close(self) -> None:
        """Both clients and both links closed, once (every view shares them)."""
        await self._calls.close()
