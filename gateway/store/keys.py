"""The whole Redis key schema: every key the gateway writes is built here, and ``SCHEMA``
lists each family with its Redis type and expiry (docs/architecture.md's key table is
generated from it; tests/integration/test_key_schema.py records turns, scans Redis and
checks every key against it).

Every key of one session carries the same hash tag ``{<tenant>.<session>}`` so that the
session's atomic scripts (append a turn, compare-and-set the tiers) stay in one Redis
Cluster slot. A user's index of sessions lives in the user's own slot, a tenant's rate
limits in the tenant's. The ids enter keys only as hashes: they may hold any printable
character, braces included, which would otherwise break the tag; the ids themselves are
kept in the meta hash.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from gateway.caching import memo

PREFIX = "mg"
TENANT_SECRET_KEY = f"{PREFIX}:tenant-secret"
# One slot for both: a key is made or revoked with its version in one script.
AUTH_KEYS = f"{PREFIX}:{{auth}}:keys"
AUTH_VERSION = f"{PREFIX}:{{auth}}:version"


def usage_key(tenant: str) -> str:
    """A tenant's stored bytes (the quota's count)."""
    return f"{PREFIX}:{{{tenant}}}:usage"


def held_key(tenant: str) -> str:
    """The quota's holds of a tenant's turns in flight (``store.quota``), in the slot of its
    count: one script reserves against both."""
    return f"{PREFIX}:{{{tenant}}}:held"


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
    def job_order(self) -> str:
        """The pending jobs' ids by trigger: the order they run in, read from its head
        whatever their number (the jobs hash holds each job)."""
        return f"{PREFIX}:{self.tag}:joborder"

    @property
    def lease(self) -> str:
        return f"{PREFIX}:{self.tag}:lease"

    @property
    def vec(self) -> str:
        return f"{PREFIX}:{self.tag}:vec"

    @property
    def index(self) -> str:
        # Never written any more (an older version's recall postings); kept so that an
        # erase still deletes it while sessions of that version are within retention.
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
            self.job_order,  # next to last: the record script finds it as KEYS[#KEYS - 1]
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


def limit_scope(tenant: str, key_id: str = "") -> str:
    """The common part of one rate-limit scope's keys: a tenant's own counters, or those of
    one of its keys. Every scope of a tenant carries the tenant's tag (one cluster slot),
    so one script admits a request against all of them."""
    scope = f"k.{key_id}" if key_id else "t"
    return f"{PREFIX}:{{rl.{tenant}}}:{scope}"


def limit_address(address: str) -> str:
    """The common part of one client address's rate-limit keys (``limits.address``): in
    the address's own slot, whatever tenant its requests are for."""
    return f"{PREFIX}:{{rl.a.{hashlib.sha256(address.encode()).hexdigest()[:32]}}}:a"


def limit_counters(scope: str, window: int) -> list[str]:
    """A scope's keys in ``admit.lua``'s order: requests in the previous and the current
    minute, tokens in the previous and the current minute, the in-flight set."""
    return [
        f"{scope}:req.{window - 1}",
        f"{scope}:req.{window}",
        f"{scope}:tok.{window - 1}",
        f"{scope}:tok.{window}",
        limit_in_flight(scope),
    ]


def limit_in_flight(scope: str) -> str:
    return f"{scope}:busy"


def ui_session(token_hash: str) -> str:
    """An inspector login, by its cookie's hash (the cookie itself is never stored)."""
    return f"{PREFIX}:{{ui}}:session:{token_hash}"


def ui_login_attempts(address_hash: str) -> str:
    """Failed inspector logins of one client address, by the address's hash."""
    return f"{PREFIX}:{{ui}}:login:{address_hash}"


# --- the schema -----------------------------------------------------------------------------

# What each <name> of a pattern stands for: the text it matches, and what it is.
PLACEHOLDERS: dict[str, tuple[str, str]] = {
    "tenant": ("[0-9a-f]+", "a tenant's id (a keyed hash of its name or key)"),
    "session": ("[0-9a-f]{24}", "a session id's hash"),
    "user": ("[0-9a-f]{24}", "a user id's hash"),
    "n": ("[0-9]+", "a shard's number"),
    "minute": ("[0-9]+", "a minute's number since the epoch"),
    "scope": (r"t|k\.[0-9a-f]{32}", "`t` (the tenant's own counters) or `k.<key id>` (a key's)"),
    "token": ("[0-9a-f]{64}", "a login cookie's hash"),
    "address": ("[0-9a-f]{32}", "a client address's hash"),
}
_PLACEHOLDER = re.compile(r"<(\w+)>")

RETENTION = "retention"  # ``redis.retention_days`` after the family's last write
NEVER = "never"


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    parts, last = [], 0
    for found in _PLACEHOLDER.finditer(pattern):
        text, _ = PLACEHOLDERS[found[1]]
        parts += [re.escape(pattern[last : found.start()]), f"(?:{text})"]
        last = found.end()
    parts.append(re.escape(pattern[last:]))
    return re.compile("".join(parts))


@dataclass(frozen=True, slots=True)
class KeyShape:
    """One family of keys: its pattern (``<name>``: see ``PLACEHOLDERS``), the type Redis's
    ``TYPE`` answers for it, how it expires (``RETENTION``, ``NEVER``, or what sets its
    time) and what it holds."""

    pattern: str
    redis_type: str
    ttl: str
    what: str
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", _pattern_regex(self.pattern))

    @property
    def expires(self) -> bool:
        return self.ttl != NEVER

    def matches(self, key: str) -> bool:
        return self.regex.fullmatch(key) is not None


_S = PREFIX + ":{<tenant>.<session>}:"
_U = PREFIX + ":{<tenant>.u<user>}:"
_RL = PREFIX + ":{rl.<tenant>}:<scope>:"
_RLA = PREFIX + ":{rl.a.<address>}:a:"

# Every family of keys the gateway writes, in the order the docs show them.
SCHEMA: tuple[KeyShape, ...] = (
    KeyShape(_S + "meta", "hash", RETENTION,
             "sid, user_id (set once, by the first turn naming a user), created, updated, turns, "
             "ended, bytes (the quota's share); gen "
             "(the log's generation: new when its end is replaced), prev and kept (the "
             "generation before, and how many messages it kept); rec, rec_first, rec_pred "
             "(the last record's id and outcome: a retried record appends nothing); "
             "forwarded (the last forwarded context's fingerprint: per message, a hash and "
             "its tokens)"),
    KeyShape(_S + "log", "list", RETENTION,
             "every message as JSON (the chat API's fields; tokens, ts, and line_tokens: its "
             "line as recall shows it, counted in cl100k_base when recorded); position + 1 "
             "is its index"),
    KeyShape(_S + "vec", "list", RETENTION,
             "each message's recall vector (128 signed bytes, empty for none), aligned with "
             "the log's end"),
    KeyShape(_S + "tiers", "string", RETENTION,
             "summaries, evolving summary, key Q/A, facts (JSON, versioned)"),
    KeyShape(_S + "pins", "hash", RETENTION, "pin id → pin JSON"),
    KeyShape(_S + "jobs", "hash", RETENTION, "job id → job JSON, while the job is pending"),
    KeyShape(_S + "joborder", "zset", RETENTION,
             "job id → its trigger, while the job is pending: the order the worker runs "
             "them in (the end of a session, trigger 0, runs after the others)"),
    KeyShape(_S + "lease", "string", "the lease's time (`PX`)",
             "the runner working on the session's jobs"),
    KeyShape(_S + "index", "hash", RETENTION,
             "not written any more: an older version's recall postings, deleted with their "
             "session"),
    KeyShape(_S + "vectors", "hash", RETENTION,
             "message index → float32 embedding (optional reranking)"),
    KeyShape(_S + "receipts", "list", RETENTION,
             "the last recorded turns' receipts (JSON), newest first: what was forwarded, "
             "per tier, and under which request id"),
    KeyShape(_S + "media", "hash", RETENTION,
             "sha256 (hex) → an image's bytes, once per session however many messages show "
             "it (`memory.media: store`)"),
    KeyShape(_S + "branches", "list", RETENTION,
             "abandoned branches, oldest first: what an edit or a regenerate took off the "
             "log's end, as {from (messages kept), at, kind (edit or regenerate), messages}"),
    KeyShape(PREFIX + ":{<tenant>.i<n>}:sessions", "zset", "retention + 5 min",
             "shard n of a tenant's sessions (16): session id → last activity (the "
             "inspector's and `GET /memory/sessions`' list)"),
    KeyShape(PREFIX + ":tenants:{t<n>}", "zset", "retention + 5 min",
             "shard n of the tenants (16): tenant id → last activity"),
    KeyShape(_U + "sessions", "set", RETENTION, "the user's session ids"),
    KeyShape(_U + "active", "zset", RETENTION,
             "the user's sessions not yet ended → last activity (the idle ones are found by "
             "score)"),
    KeyShape(_U + "history", "list", RETENTION,
             "the user's last ended sessions: final summary and facts"),
    KeyShape(_U + "profile", "string", RETENTION,
             "cross-session summary and facts built from the history"),
    KeyShape(PREFIX + ":{<tenant>}:usage", "string", RETENTION,
             "bytes of messages and pins the tenant has stored, and those held for turns "
             "in flight (its quota's count)"),
    KeyShape(PREFIX + ":{<tenant>}:held", "zset", RETENTION,
             "the quota's holds of turns in flight: `<hold id>:<bytes>` → its expiry; "
             "settled by the turn's record, or given back once expired"),
    KeyShape(PREFIX + ":jobs:{<n>}", "stream", NEVER,
             "shard n of the job notices {tenant, sid, job} (`worker.job_shards`), capped in "
             "length; consumer group `summarizers`. A session's notices all go to one shard; "
             "the shard number is the hash tag, so on a cluster the shards spread over the "
             "masters"),
    KeyShape(TENANT_SECRET_KEY, "string", NEVER,
             "the HMAC key of tenant ids (when `server.tenant_secret` is not set)"),
    KeyShape(AUTH_KEYS, "hash", NEVER,
             "gateway keys made through `/admin/keys`: key hash → record (tenant, users, "
             "upstream key name, quota); never a key"),
    KeyShape(AUTH_VERSION, "string", NEVER,
             "<epoch>:<n>, n growing with every key made or revoked: processes re-read the "
             "keys when it moves; a new epoch after a loss of data, so it never repeats"),
    KeyShape(_RL + "req.<minute>", "string", "2 min", "requests admitted in a minute"),
    KeyShape(_RL + "tok.<minute>", "string", "2 min", "tokens reserved and charged in a minute"),
    KeyShape(_RL + "busy", "zset", "`limits.lease_s`",
             "requests in flight: lease id → its expiry"),
    KeyShape(_RLA + "req.<minute>", "string", "2 min",
             "requests admitted in a minute from one client address (`limits.address`)"),
    KeyShape(_RLA + "tok.<minute>", "string", "2 min",
             "tokens charged in a minute to one client address"),
    KeyShape(_RLA + "busy", "zset", "`limits.lease_s`",
             "one client address's requests in flight: lease id → its expiry"),
    KeyShape(PREFIX + ":{ui}:session:<token>", "string", "`ui.session_s`",
             "an inspector login (its cookie's hash)"),
    KeyShape(PREFIX + ":{ui}:login:<address>", "string", "`ui.login_window_s`",
             "failed inspector logins of one client address"),
)  # fmt: skip


def shapes_of(key: str) -> tuple[KeyShape, ...]:
    """The families ``key`` belongs to: exactly one for every key the gateway writes."""
    return tuple(shape for shape in SCHEMA if shape.matches(key))
