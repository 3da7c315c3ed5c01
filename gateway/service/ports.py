"""What the service needs of the clients it is given: each a Protocol, so a test passes a
small fake of its own and the service never names a concrete client. The store's parts
are here too, for the routes, the middleware and the inspector above the service."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from gateway.memory.branches import Branch
from gateway.memory.images import Blob
from gateway.memory.jobs import Job
from gateway.memory.model import Message, Pin, SessionState, Tiers
from gateway.store.catalog import ListedSession, StoredReceipt
from gateway.store.keys import SessionKeys, UserKeys
from gateway.store.pending_jobs import Failed, JobHead, Pending
from gateway.store.redis_store import (
    Ask,
    Held,
    JobNotice,
    Joining,
    Known,
    Loaded,
    Predicted,
    Recorded,
    Reservation,
)


class Embedder(Protocol):
    """An embeddings model (``memory.tiers.recall.embeddings``): one vector per text."""

    async def embed(self, texts: list[str]) -> list[list[float]]: ...


# --- the store's parts (``gateway.store.redis_store``), as their callers use them ---


class SessionStore(Protocol):
    """A session's memory: the turn's load and record, and what the worker and the memory
    API read and write of a session (``store.sessions``)."""

    async def load(self, keys: SessionKeys, tail: int) -> SessionState: ...

    async def load_turn(
        self,
        keys: SessionKeys,
        tail: int,
        *,
        known: Known | None = None,
        vectors: bool = False,
        most: int = 0,
        user: UserKeys | None = None,
        peers: Sequence[tuple[SessionKeys, Known | None]] = (),
        reserve: Ask | None = None,
        now: float = 0.0,
    ) -> Loaded: ...

    async def record(
        self,
        keys: SessionKeys,
        messages: Sequence[Message],
        *,
        now: float,
        user_id: str | None,
        truncate_to: int | None = None,
        expected_count: int | None = None,
        vectors: Sequence[bytes] = (),
        predicted: Predicted | None = None,
        joining: Joining | None = None,
        receipt: StoredReceipt | None = None,
        listed: bool = True,
        record_id: str = "",
        active: UserKeys | None = None,
        media: Sequence[Blob] = (),
        forwarded: str = "",
        held: Held | None = None,
    ) -> Recorded: ...

    async def archive_page(
        self, keys: SessionKeys, start: int, stop: int, *, vectors: bool
    ) -> tuple[str, int, tuple[Message, ...], tuple[bytes | None, ...]]: ...

    async def messages_at(self, keys: SessionKeys, indexes: Sequence[int]) -> list[Message]: ...

    async def messages(self, keys: SessionKeys, start: int, end: int) -> list[Message]: ...

    async def tail(self, keys: SessionKeys, n: int) -> tuple[int, list[Message]]: ...

    async def save_vectors(self, keys: SessionKeys, vectors: dict[int, bytes]) -> bool: ...

    async def vectors(self, keys: SessionKeys, indexes: Sequence[int]) -> dict[int, bytes]: ...

    async def media(self, keys: SessionKeys, hashes: Sequence[str]) -> dict[str, bytes]: ...

    async def usage(self, tenant: str) -> int: ...

    async def branches(self, keys: SessionKeys) -> list[Branch]: ...

    async def job_state(self, keys: SessionKeys) -> tuple[bool, Tiers, list[Job]]: ...

    async def tiers(self, keys: SessionKeys) -> tuple[bool, Tiers]: ...

    async def job_view(
        self, keys: SessionKeys, job_id: str
    ) -> tuple[bool, Tiers, Pending | None]: ...

    async def write_tiers(
        self, keys: SessionKeys, expected_version: int, tiers: Tiers, job: Job
    ) -> int: ...

    async def add_pin(self, keys: SessionKeys, pin: Pin, charged: int = 0) -> None: ...

    async def delete_pin(self, keys: SessionKeys, pin_id: str) -> bool: ...

    async def meta(self, keys: SessionKeys) -> dict[str, str]: ...

    async def end_session(self, keys: SessionKeys, now: float) -> bool: ...

    async def erase_session(self, keys: SessionKeys) -> bool: ...

    async def erase_user(self, user: UserKeys) -> int: ...


class QuotaStore(Protocol):
    """A tenant's storage quota: bytes reserved before a write, given back when it fails
    (``store.quotas``; a turn's go in its load and record instead)."""

    async def reserve(self, ask: Ask, now: float) -> Reservation: ...

    async def give_back(self, tenant: str, held: Held) -> None: ...


class UserStore(Protocol):
    """A user's memory across sessions: their sessions' index, history and profile
    (``store.users``)."""

    async def index_user_session(self, user: UserKeys, session_id: str) -> None: ...

    async def user_sessions(self, user: UserKeys) -> list[str]: ...

    async def newest_sessions(
        self, user: UserKeys, sessions: list[str], limit: int
    ) -> list[str]: ...

    async def idle_sessions(
        self, user: UserKeys, *, idle_before: float, exclude: str
    ) -> list[str]: ...

    async def user_history(self, user: UserKeys) -> list[dict[str, Any]]: ...

    async def save_user_history(
        self, user: UserKeys, entry: dict[str, Any], profile: dict[str, Any], keep: int
    ) -> None: ...

    async def leave_active(self, user: UserKeys, session_id: str) -> None: ...

    async def forget_user_session(self, user: UserKeys, session_id: str) -> None: ...

    async def user_profile(self, user: UserKeys) -> dict[str, Any] | None: ...

    async def rewrite_fact(
        self, user: UserKeys, session_id: str, old: str, new: str | None
    ) -> None: ...


class JobStream(Protocol):
    """The job stream as its consumer reads it: the shards' notices, through the workers'
    group, each acknowledged once its job ran (what ``Worker`` needs of ``store.queue``)."""

    @property
    def job_shards(self) -> int: ...

    async def ensure_group(self, shard: int) -> None: ...

    async def read_jobs(
        self, shard: int, consumer: str, *, count: int, block_ms: int
    ) -> list[JobNotice]: ...

    async def reclaim_jobs(
        self, shard: int, consumer: str, *, min_idle_ms: int, count: int
    ) -> list[JobNotice]: ...

    async def hold_job(self, notice: JobNotice, consumer: str) -> None: ...

    async def ack_job(self, notice: JobNotice) -> None: ...


class JobQueue(JobStream, Protocol):
    """The summary jobs: their stream, what puts jobs on it and takes them off, and the
    sessions' leases (``store.queue``)."""

    async def enqueue(self, keys: SessionKeys, jobs: Sequence[Job]) -> None: ...

    async def end_sessions(self, user: UserKeys, session_ids: Sequence[str], end: Job) -> None: ...

    async def finish_job(self, keys: SessionKeys, job: Job) -> None: ...

    async def job_head(self, keys: SessionKeys, job_id: str) -> JobHead: ...

    async def fail_job(
        self, keys: SessionKeys, job_id: str, *, allowed: int, now: float, backoff_s: float,
        most_s: float,
    ) -> Failed: ...  # fmt: skip

    async def take_lease(self, keys: SessionKeys, holder: str, ttl_ms: int) -> bool: ...

    async def release_lease(self, keys: SessionKeys, holder: str) -> None: ...


class ServerStore(Protocol):
    """The Redis server itself (``store.server``)."""

    async def ping(self, timeout_s: float | None = None) -> None: ...

    async def tenant_secret(
        self, timeout_s: float | None = None, *, keep: bytes | None = None
    ) -> bytes: ...


class CatalogStore(Protocol):
    """What an operator browses (``store.catalog``)."""

    async def tenants(self, *, now: float, limit: int = 100) -> list[tuple[str, float]]: ...

    async def sessions(
        self, tenant: str, *, now: float, search: str | None = None, limit: int = 50
    ) -> list[ListedSession]: ...

    async def receipts(self, keys: SessionKeys) -> list[dict[str, Any]]: ...


class LimitStore(Protocol):
    """The rate limits' counters (``store.limits``). A group: one slot's scopes (their key
    prefixes) and its script's arguments."""

    async def admit(
        self, groups: Sequence[tuple[Sequence[str], Sequence[Any]]], window: int
    ) -> list[list[Any]]: ...

    async def reserve(
        self, groups: Sequence[tuple[Sequence[str], Sequence[Any]]], window: int
    ) -> list[list[Any]]: ...

    async def release(
        self,
        lease_id: str,
        *,
        in_flight: Sequence[str],
        charged: Sequence[str],
        window: int,
        tokens: int,
        ttl_s: int,
        uncounted: Sequence[str] = (),
    ) -> None: ...


class LoginStore(Protocol):
    """The inspector's login sessions and failed attempts (``store.ui``)."""

    async def open(self, token: str, ttl_s: int) -> None: ...

    async def is_open(self, token: str) -> bool: ...

    async def close(self, token: str) -> None: ...

    async def failed(self, address: str, window_s: float) -> tuple[int, float]: ...


class KeyStore(Protocol):
    """The gateway keys made through the admin API (``store.gateway_keys``)."""

    async def changed_since(self, version: str | None) -> tuple[str, dict[str, bytes]] | None: ...

    async def save(self, key_id: str, data: dict[str, Any]) -> None: ...

    async def revoke(self, key_id: str) -> bool: ...


class Store(Protocol):
    """The store as a whole: its parts, each over the same link (``RedisStore``)."""

    @property
    def sessions(self) -> SessionStore: ...

    @property
    def quotas(self) -> QuotaStore: ...

    @property
    def users(self) -> UserStore: ...

    @property
    def queue(self) -> JobQueue: ...

    @property
    def server(self) -> ServerStore: ...

    @property
    def catalog(self) -> CatalogStore: ...

    @property
    def limits(self) -> LimitStore: ...

    @property
    def ui(self) -> LoginStore: ...

    @property
    def gateway_keys(self) -> KeyStore: ...
