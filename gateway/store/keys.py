"""The whole Redis key schema.

Every key of one session carries the same hash tag ``{<tenant>.<session>}`` so that the
session's atomic scripts (append a turn, compare-and-set the tiers) stay in one Redis
Cluster slot. A user's index of sessions lives in the user's own slot. The ids enter
keys only as hashes: they may hold any printable character, braces included, which
would otherwise break the tag; the ids themselves are kept in the meta hash.

    mg:{t.s}:meta     HASH    sid, user_id, created, updated, turns, ended; gen (the log's
                              generation: new when its end is replaced), prev and kept
                              (the generation before, and how many messages it kept)
    mg:{t.s}:log      LIST    every message as JSON; position + 1 is its index
    mg:{t.s}:vec      LIST    each message's recall vector (128 signed bytes, "" for none),
                              aligned with the log's end: the last entry is the last message's
    mg:{t.s}:tiers    STRING  summaries, evolving summary, key Q/A, facts (JSON, versioned)
    mg:{t.s}:pins     HASH    pin id -> pin JSON
    mg:{t.s}:jobs     HASH    job id -> job JSON, while the job is pending
    mg:{t.s}:lease    STRING  the runner working on the session's jobs (expires)
    mg:{t.s}:index    HASH    (no longer written: an older version's recall postings,
                              erased with the session)
    mg:{t.s}:vectors  HASH    message index -> float32 embedding (optional reranking)
    mg:{t.s}:receipts LIST    the last recorded turns' receipts (JSON), newest first: what
                              was forwarded, per tier, and under which request id
    mg:{t.s}:media    HASH    sha256 (hex) -> an image's bytes, once per session however
                              many messages show it (``memory.media: store``)
    mg:{t.s}:branches LIST    abandoned branches, oldest first: what an edit or a regenerate
                              took off the log's end, as {"from": messages kept, "at": time,
                              "kind": "edit"|"regenerate", "messages": [stored JSON...]}
    mg:{t.i<n>}:sessions ZSET shard n of a tenant's sessions: session id -> last activity
                              (the inspector's and ``GET /memory/sessions``' list)
    mg:tenants:{t<n>} ZSET    shard n of the tenants: tenant id -> last activity
    mg:{t.u}:sessions SET     session ids of one user
    mg:{t.u}:history  LIST    the user's last ended sessions: final summary and facts
    mg:{t.u}:profile  STRING  cross-session summary and facts built from the history
    mg:jobs:{n}       STREAM  shard n of the job notices {tenant, sid, job}; consumer
                              group "summarizers". A session's notices all go to one
                              shard; the shard number is the hash tag, so on a cluster
                              the shards spread over the masters (``worker.job_shards``)
    mg:tenant-secret  STRING  the HMAC key of tenant ids (when not configured)
    mg:{auth}:keys    HASH    gateway keys made through /admin/keys: key hash -> record
                              (tenant, users, upstream key name, quota); never a key
    mg:{auth}:version STRING  grows with every key made or revoked: processes re-read
                              the keys when it moves
    mg:{t}:usage      STRING  bytes of messages a tenant has stored (its quota)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from gateway.caching import memo

PREFIX = "mg"
TENANT_SECRET_KEY = f"{PREFIX}:tenant-secret"
# One slot for both: a key is made or revoked with its version in one script.
AUTH_KEYS = f"{PREFIX}:{{auth}}:keys"
AUTH_VERSION = f"{PREFIX}:{{auth}}:version"


def usage_key(tenant: str) -> str:
    """A tenant's stored bytes (the quota's count)."""
    return f"{PREFIX}:{{{tenant}}}:usage"


JOB_GROUP = "summarizers"
# The tenant and session indexes are written on every turn: sharded, so that on a cluster
# no one master takes every tenant's (or a big tenant's every) write.
INDEX_SHARDS = 16


@memo(maxsize=4096)
def _digest(value: str) -> str:
    # Every key of a session is built from it, several times a request: hash an id once.
    return hashlib.sha256(value.encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """Key builders for one tenant's session."""

    tenant: str
    session_id: str

    @property
    def tag(self) -> str:
        return f"{{{self.tenant}.{_digest(self.session_id)}}}"

    @property
    def meta(self) -> str:
        return f"{PREFIX}:{self.tag}:meta"

    @property
    def log(self) -> str:
        return f"{PREFIX}:{self.tag}:log"

    @property
    def tiers(self) -> str:
        return f"{PREFIX}:{self.tag}:tiers"

    @property
    def pins(self) -> str:
        return f"{PREFIX}:{self.tag}:pins"

    @property
    def jobs(self) -> str:
        return f"{PREFIX}:{self.tag}:jobs"

    @property
    def lease(self) -> str:
        return f"{PREFIX}:{self.tag}:lease"

    @property
    def vec(self) -> str:
        return f"{PREFIX}:{self.tag}:vec"

    @property
    def index(self) -> str:
        return f"{PREFIX}:{self.tag}:index"

    @property
    def vectors(self) -> str:
        return f"{PREFIX}:{self.tag}:vectors"

    @property
    def receipts(self) -> str:
        return f"{PREFIX}:{self.tag}:receipts"

    @property
    def media(self) -> str:
        return f"{PREFIX}:{self.tag}:media"

    @property
    def branches(self) -> str:
        return f"{PREFIX}:{self.tag}:branches"

    @property
    def listed_in(self) -> str:
        """The tenant's session index shard that lists this session."""
        return TenantKeys(self.tenant).sessions(index_shard(self.session_id))

    @property
    def tenant_listed_in(self) -> str:
        """The tenants index shard that lists this session's tenant."""
        return tenants_index(index_shard(self.session_id))

    def all(self) -> tuple[str, ...]:
        return (
            self.meta, self.log, self.tiers, self.pins, self.jobs, self.lease, self.vec,
            self.vectors, self.receipts, self.index, self.media,
            self.branches,  # last: the record script finds it as KEYS[#KEYS]
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class TenantKeys:
    """Key builders for one tenant's index of its sessions."""

    tenant: str

    def sessions(self, shard: int) -> str:
        return f"{PREFIX}:{{{self.tenant}.i{shard}}}:sessions"

    def all_sessions(self) -> tuple[str, ...]:
        return tuple(self.sessions(shard) for shard in range(INDEX_SHARDS))


def tenants_index(shard: int) -> str:
    """Shard ``shard`` of the index of tenants."""
    return f"{PREFIX}:tenants:{{t{shard}}}"


def all_tenants_indexes() -> tuple[str, ...]:
    return tuple(tenants_index(shard) for shard in range(INDEX_SHARDS))


def index_shard(session_id: str) -> int:
    return int(_digest(session_id)[:8], 16) % INDEX_SHARDS


@dataclass(frozen=True, slots=True)
class UserKeys:
    """Key builders for one tenant's user (an index of their sessions)."""

    tenant: str
    user_id: str

    @property
    def tag(self) -> str:
        return f"{{{self.tenant}.u{_digest(self.user_id)}}}"

    @property
    def sessions(self) -> str:
        return f"{PREFIX}:{self.tag}:sessions"

    @property
    def active(self) -> str:
        """The user's sessions not yet ended, scored by their last activity: the idle
        ones are found by score, however many sessions the user has."""
        return f"{PREFIX}:{self.tag}:active"

    @property
    def history(self) -> str:
        return f"{PREFIX}:{self.tag}:history"

    @property
    def profile(self) -> str:
        return f"{PREFIX}:{self.tag}:profile"

    def all(self) -> tuple[str, ...]:
        return (self.sessions, self.active, self.history, self.profile)


def job_stream(shard: int) -> str:
    """Shard ``shard`` of the job stream."""
    return f"{PREFIX}:jobs:{{{shard}}}"


def job_shard(keys: SessionKeys, shards: int) -> int:
    """The shard of a session's job notices: always the same one, spread evenly."""
    return int(_digest(f"{keys.tenant}.{keys.session_id}")[:8], 16) % shards
