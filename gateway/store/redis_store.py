"""The Redis store: one round trip to load a session, one atomic script to record a turn.

Every call runs under a deadline (``redis.timeout_ms`` on the request path): redis-py's
own defaults take seconds to notice a dead server, and the gateway must answer first. A
missed deadline or any connection error surfaces as ``StoreUnavailable``; the caller
decides between fail-open and fail-closed. Key shapes live in ``keys.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.maint_notifications import MaintNotificationsConfig

from gateway import codec, metrics
from gateway.memory.jobs import Job
from gateway.memory.model import Message, Pin, SessionState, Tiers
from gateway.store import catalog
from gateway.store.cluster import ClusterConnections
from gateway.store.connections import Connections
from gateway.store.keys import (
    JOB_GROUP,
    TENANT_SECRET_KEY,
    SessionKeys,
    UserKeys,
    job_shard,
    job_stream,
    usage_key,
)
from gateway.store.loop_lag import lag_tolerant_timeout
from gateway.store.tiers_cache import TiersCache

T = TypeVar("T")

# The job stream is a notice board, not the record (each session's jobs hash is):
# trimming each shard approximately keeps it bounded when no worker runs.
STREAM_MAXLEN = 100_000


class StoreUnavailable(Exception):
    """Redis did not answer in time, or answered with an error."""


class TailMoved(StoreUnavailable):
    """A record that relied on the log's length found another turn had landed first.

    A kind of unavailability for the caller: when it persists the turn is not recorded and
    the answer is reported degraded.
    """


@dataclass(frozen=True, slots=True)
class Recorded:
    first: int  # index of the first appended message
    count: int  # messages in the session now
    turns: int  # user messages in the session now
    new_user: bool  # the session's user id was set or changed by this append
    predicted: bool = False  # the append landed where predicted: its writes were made
    idle: tuple[str, ...] = ()  # with ``Joining.idle_before``: the user's idle sessions
    generation: str = ""  # the log's generation after the append (see memory.archive)


@dataclass(frozen=True, slots=True)
class Joining:
    """A session joining its user's index with this append; with ``idle_before``, the
    user's sessions idle since then (up to ``IDLE_BATCH``) are found in the same round
    trip."""

    user: UserKeys
    idle_before: float | None = None


# Idle sessions ended at once when a user starts a session: the rest wait for the next.
IDLE_BATCH = 32


@dataclass(frozen=True, slots=True)
class Known:
    """What a process holds of a session's log: its first ``count`` messages, under
    ``generation`` (see ``memory.archive``)."""

    generation: str
    count: int


@dataclass(frozen=True, slots=True)
class LogSlice:
    """Messages of a log from position ``start`` (0-based) to its end, with their stored
    vectors (None where there is none). ``warm``: ``start`` is where what the caller
    holds ends, under ``generation`` (it drops anything it holds past ``start``)."""

    generation: str
    count: int  # messages in the log
    start: int
    warm: bool
    messages: tuple[Message, ...]
    vectors: tuple[bytes | None, ...]


@dataclass(frozen=True, slots=True)
class Loaded:
    """A session as one request loads it: its state, the slice of its log read with it,
    and the same of each of the user's other sessions asked for (``peers``)."""

    state: SessionState
    log: LogSlice
    peers: dict[SessionKeys, LogSlice]
    usage: int | None = None  # when asked for: the tenant's stored bytes


@dataclass(frozen=True, slots=True)
class Predicted:
    """Writes that depend on where an append lands (job ranges, pinned message indexes),
    computed before the call for the log the plan expects, so they go in the same round
    trip. The record script makes them only if the append lands there: ``first`` is the
    index its first message gets, ``turns`` the user messages stored before it."""

    first: int
    turns: int
    jobs: Sequence[Job] = ()
    pins: Sequence[Pin] = ()


@dataclass(frozen=True, slots=True)
class JobNotice:
    entry_id: bytes
    keys: SessionKeys
    job_id: str
    shard: int = 0  # the job-stream shard it was read from


# KEYS: meta, log, tiers, pins, jobs, lease, vec, ... (the session's keys, all of which
# get the retention TTL).  ARGV: ttl_s, now, session_id, user_id ("" = keep), truncate_to
# (-1 = none), expected_count (-1 = any), user messages appended, M = messages appended,
# predicted first index (-1 = none), predicted turns before, J = predicted jobs, P =
# predicted pins, a new generation token, the appended bytes, the turn's record id, M
# message JSONs, M vectors ("" = none), J (job id, job JSON) pairs, P (pin id, pin JSON)
# pairs.
# A record is idempotent by its id: sent again because its reply was lost (Redis went
# away after running it), it appends nothing and answers what it did (the last element
# of the reply is then 1), so a retry never stores a turn twice.
# Appends after an optional truncation (a regenerate replacing the stored answer)
# in one step, so concurrent turns never interleave and a reader never sees half a turn.
# A plan made against a given log length (an import, a retry, a regenerate) writes
# nothing if another turn landed meanwhile: it returns first = -1 and the caller plans
# again, rather than importing twice or deleting someone else's turn.
# The predicted jobs and pins are written only when the append lands where the caller
# predicted (the usual case: no concurrent turn on the session); otherwise the reply
# says so and the caller computes them again from the real indexes.
# The vectors list is aligned with the log's end (a log recorded before vectors existed
# has fewer); a truncation takes the same number off both. It gives the log a new
# generation (``memory.archive``), remembering the one before and how many messages
# it kept, so a process holding the old one drops only what was replaced.
RECORD_SCRIPT = """
local n = redis.call('LLEN', KEYS[2])
if ARGV[15] ~= '' and redis.call('HGET', KEYS[1], 'rec') == ARGV[15] then
  -- This very turn again (its reply was lost): what it did, not a second append.
  local did = redis.call('HMGET', KEYS[1], 'rec_first', 'rec_pred', 'turns', 'gen')
  return {tonumber(did[1]), n, tonumber(did[3]), 0, tonumber(did[2]), did[4], 1}
end
local expected = tonumber(ARGV[6])
if expected >= 0 and n ~= expected then
  return {-1, n, 0, 0, 0, '', 0}
end
local gen = redis.call('HGET', KEYS[1], 'gen')
local truncate_to = tonumber(ARGV[5])
if truncate_to >= 0 and n > truncate_to then
  local vectors = redis.call('LLEN', KEYS[7])
  while n > truncate_to do
    redis.call('RPOP', KEYS[2])
    n = n - 1
    if vectors > 0 then
      redis.call('RPOP', KEYS[7])
      vectors = vectors - 1
    end
  end
  redis.call('HSET', KEYS[1], 'prev', gen or '', 'kept', n, 'gen', ARGV[13])
  gen = ARGV[13]
elseif not gen then
  redis.call('HSET', KEYS[1], 'gen', ARGV[13])
  gen = ARGV[13]
end
local first = n + 1
local m, jobs, pins = tonumber(ARGV[8]), tonumber(ARGV[11]), tonumber(ARGV[12])
local predicted = 0
if first == tonumber(ARGV[9])
    and tonumber(redis.call('HGET', KEYS[1], 'turns') or 0) == tonumber(ARGV[10]) then
  predicted = 1
end
if m > 0 then
  n = redis.call('RPUSH', KEYS[2], unpack(ARGV, 16, 15 + m))
  redis.call('RPUSH', KEYS[7], unpack(ARGV, 16 + m, 15 + 2 * m))
  redis.call('HINCRBY', KEYS[1], 'bytes', tonumber(ARGV[14]))
end
redis.call('HSET', KEYS[1], 'rec', ARGV[15], 'rec_first', first, 'rec_pred', predicted)
local at = 16 + 2 * m
if predicted == 1 then
  for i = at, at + 2 * jobs - 1, 2 do
    redis.call('HSET', KEYS[5], ARGV[i], ARGV[i + 1])
  end
  for i = at + 2 * jobs, at + 2 * (jobs + pins) - 1, 2 do
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  end
end
local new_user = 0
if ARGV[4] ~= '' and redis.call('HGET', KEYS[1], 'user_id') ~= ARGV[4] then
  redis.call('HSET', KEYS[1], 'user_id', ARGV[4])
  new_user = 1
end
redis.call('HSET', KEYS[1], 'sid', ARGV[3], 'updated', ARGV[2])
redis.call('HSETNX', KEYS[1], 'created', ARGV[2])
redis.call('HDEL', KEYS[1], 'ended')
local turns = redis.call('HINCRBY', KEYS[1], 'turns', tonumber(ARGV[7]))
local ttl = tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('EXPIRE', KEYS[i], ttl)
end
return {first, n, turns, new_user, predicted, gen, 0}
"""

# What returns a slice of the log with its vectors, aligned (a Lua fragment shared by the
# two scripts below): ``start`` is a 0-based position; the slice runs to ``stop``.
_SLICE = """
local function slice(log, vec, n, start, stop, with_vectors)
  local messages, vectors, offset = {}, {}, 0
  if start <= stop then
    messages = redis.call('LRANGE', log, start, stop)
    if with_vectors then
      -- The vectors list covers the log's last LLEN entries: the position of its first.
      local first = n - redis.call('LLEN', vec)
      offset = start - first  -- negative: that many messages have no vector
      if stop >= first then
        vectors = redis.call('LRANGE', vec, math.max(offset, 0), stop - first)
      end
    end
  end
  return messages, offset, vectors
end
"""

# KEYS: meta, log, tiers, pins, jobs, vec.  ARGV: tail, the generation the caller holds
# ("" = none), how many messages it holds, most (the longest delta read), vectors (1/0).
# A session as one request needs it, read atomically: its meta and length, its tiers,
# pins and pending jobs (when tail > 0), and messages from ``start`` on with their
# vectors. Where the caller holds the log under this generation (or under the one before,
# up to what that kept), ``start`` is where what it holds ends and ``warm`` is 1: usually
# the previous turn's messages, or none. Otherwise ``start`` leaves the newest ``tail``
# (the caller reads older ones by pages if it needs them: ARCHIVE_PAGE_SCRIPT).
LOAD_SCRIPT = (
    _SLICE
    + """
local tail, held, most = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[4])
local meta = redis.call('HGETALL', KEYS[1])
local n = redis.call('LLEN', KEYS[2])
local gen = redis.call('HGET', KEYS[1], 'gen')
local start, warm = math.max(n - tail, 0), 0
if ARGV[2] ~= '' and gen then
  if gen == ARGV[2] then
    if held <= n and n - held <= most then
      start, warm = held, 1
    end
  elseif redis.call('HGET', KEYS[1], 'prev') == ARGV[2] then
    local kept = tonumber(redis.call('HGET', KEYS[1], 'kept'))
    if kept <= held and n - kept <= most then
      start, warm = kept, 1
    end
  end
end
local messages, offset, vectors = slice(KEYS[2], KEYS[6], n, start, n - 1, ARGV[5] == '1')
local tiers, pins, pending = false, {}, 0
if tail > 0 then
  tiers = redis.call('GET', KEYS[3])
  pins = redis.call('HVALS', KEYS[4])
  pending = redis.call('HLEN', KEYS[5])
end
return {meta, n, start, warm, messages, offset, vectors, tiers, pins, pending}
"""
)

# KEYS: meta, log, vec.  ARGV: start, stop (0-based, inclusive), vectors (1/0). Older
# messages of a log, with the generation they belong to (a process filling its archive
# checks it did not change between pages).
ARCHIVE_PAGE_SCRIPT = (
    _SLICE
    + """
local n = redis.call('LLEN', KEYS[2])
local start, stop = tonumber(ARGV[1]), math.min(tonumber(ARGV[2]), n - 1)
local messages, offset, vectors = slice(KEYS[2], KEYS[3], n, start, stop, ARGV[3] == '1')
return {redis.call('HGET', KEYS[1], 'gen') or '', n, messages, offset, vectors}
"""
)

# KEYS: meta, tiers, jobs.  ARGV: expected version, tiers JSON, job id, ttl_s.
# Writes a job's result only if nobody wrote since the job read the tiers (versions never
# go back), and only if the session still exists: an erased session must not be
# resurrected by a job that was in flight when it was erased.
WRITE_TIERS_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[2], KEYS[3])
  return -1
end
local current = redis.call('GET', KEYS[2])
local version = 0
if current then
  version = tonumber(cjson.decode(current)['version'])
end
if version ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'EX', tonumber(ARGV[4]))
redis.call('HDEL', KEYS[3], ARGV[3])
return 1
"""


# KEYS: meta. ARGV: now. Marks the session ended only if it still exists: an end that
# was in flight when the session was erased must not leave its meta hash behind.
END_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'ended', ARGV[1])
return 1
"""


# KEYS: meta, vectors. ARGV: ttl_s, then (index, vector) pairs. An embeddings job still
# running when its session was erased must not write the session's vectors back.
SAVE_VECTORS_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[1]))
return 1
"""

# KEYS: a tenant's usage. ARGV: bytes erased. A tenant whose last bytes go has no count.
RELEASE_USAGE_SCRIPT = """
if redis.call('DECRBY', KEYS[1], ARGV[1]) <= 0 then
  redis.call('DEL', KEYS[1])
end
return 1
"""

# KEYS: lease. ARGV: holder. Releases the lease only if we still hold it.
RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


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


def _fields(flat: Sequence[bytes]) -> dict[bytes, bytes]:
    """A hash as a script returns HGETALL (a flat list of names and values), as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _slice(
    messages: Sequence[bytes], offset: int, vectors: Sequence[bytes], start: int
) -> tuple[tuple[Message, ...], tuple[bytes | None, ...]]:
    """A script's slice of the log (``_SLICE``): the messages from position ``start``,
    and their vectors aligned with them."""
    parsed = tuple(Message.from_json(raw, start + 1 + i) for i, raw in enumerate(messages))
    aligned: list[bytes | None] = [None] * max(0, -offset)
    aligned += [bytes(v) if v else None for v in vectors]
    aligned += [None] * (len(parsed) - len(aligned))
    return parsed, tuple(aligned[: len(parsed)])


def _log_slice(reply: Sequence[Any], fields: dict[bytes, bytes]) -> LogSlice:
    """The log part of a LOAD_SCRIPT reply."""
    _, count, start, warm, raw, offset, raw_vectors, *_ = reply
    messages, vectors = _slice(raw, int(offset), raw_vectors, int(start))
    generation = fields.get(b"gen", b"").decode()
    return LogSlice(generation, int(count), int(start), bool(warm), messages, vectors)


def _ask_idle(pipe: Any, user: UserKeys, idle_before: float) -> None:
    pipe.zrangebyscore(user.active, "-inf", f"({idle_before!r}", start=0, num=IDLE_BATCH)


def _idle(reply: Any) -> tuple[str, ...]:
    return tuple(sorted(item.decode() for item in reply))


def _notice(shard: int, entry_id: bytes, fields: dict[bytes, bytes]) -> JobNotice:
    keys = SessionKeys(fields[b"tenant"].decode(), fields[b"sid"].decode())
    return JobNotice(entry_id, keys, fields[b"job"].decode(), shard)


# For calls whose deadline is kept below the store (the request path's connections).
_UNTIMED: AbstractAsyncContextManager[Any] = contextlib.nullcontext()


class RedisStore:
    """Session memory in Redis, every call bounded by a deadline."""

    def __init__(
        self,
        client: redis.Redis | RedisCluster,
        *,
        timeout_s: float,
        retention_s: int,
        lag_tolerant: bool = False,  # deadlines do not count the event loop's lateness
        job_shards: int = 1,
    ) -> None:
        self.client: Any = client  # the same commands on a single Redis and a cluster
        self.job_shards = job_shards
        self.timeout_s = timeout_s
        self.lag_tolerant = lag_tolerant
        self.retention_s = retention_s
        self._record = client.register_script(RECORD_SCRIPT)
        self._write_tiers = client.register_script(WRITE_TIERS_SCRIPT)
        self._release = client.register_script(RELEASE_SCRIPT)
        self._end = client.register_script(END_SCRIPT)
        self._save_vectors = client.register_script(SAVE_VECTORS_SCRIPT)
        self._release_usage = client.register_script(RELEASE_USAGE_SCRIPT)
        self._load = client.register_script(LOAD_SCRIPT)
        self._archive_page = client.register_script(ARCHIVE_PAGE_SCRIPT)
        self._tiers = TiersCache()
        # Those called by sha in pipelines.
        self._scripts = [self._record, self._load, self._archive_page]
        self._connections: Connections | ClusterConnections = (
            ClusterConnections(client)
            if isinstance(client, RedisCluster)
            else Connections(client.connection_pool)
        )
        # Builds the request path's commands (redis-py's encoding of each command's
        # arguments); never connects: ``_connections`` sends them.
        self._commands = redis.Redis()

    async def bounded(
        self,
        call: Callable[[], Awaitable[T]],
        timeout_s: float | None = None,
        op: Callable[..., Any] | None = None,  # names the operation in metrics (else call)
    ) -> T:
        """``call`` under the store's deadline; its failure is ``StoreUnavailable``. Also
        for the store's own modules (``catalog``) that build on this connection."""
        deadline = timeout_s or self.timeout_s
        timer = lag_tolerant_timeout(deadline) if self.lag_tolerant else asyncio.timeout(deadline)
        return await self._guarded(call, op, timer)

    async def _guarded(
        self,
        call: Callable[[], Awaitable[T]],
        op: Callable[..., Any] | None,
        timer: AbstractAsyncContextManager[Any] = _UNTIMED,
    ) -> T:
        """``call``'s failure as ``StoreUnavailable``, its time in the metrics."""
        started = time.perf_counter()
        try:
            async with timer:
                return await call()
        except (TimeoutError, RedisError, OSError) as error:
            raise StoreUnavailable(f"redis: {type(error).__name__}: {error}") from error
        finally:
            metrics.redis_call(op or call, started)

    async def pipeline(
        self, build: Callable[[Any], None], timeout_s: float | None = None
    ) -> list[Any]:
        """One round trip of several commands (not a transaction)."""

        async def run() -> list[Any]:
            async with self.client.pipeline(transaction=False) as pipe:
                build(pipe)
                replies: list[Any] = await pipe.execute()
                return replies

        return await self.bounded(run, timeout_s, op=build)

    async def ping(self, timeout_s: float | None = None) -> None:
        await self.bounded(self.client.ping, timeout_s)

    async def server_config(
        self, names: Sequence[str], timeout_s: float | None = None
    ) -> dict[str, str] | None:
        """``CONFIG GET`` of each name; None where CONFIG is disabled (managed Redis)."""

        async def read() -> dict[str, str] | None:
            found: dict[str, str] = {}
            try:
                for name in names:  # one name per call: Redis < 7 takes only one
                    reply = await self.client.config_get(name)
                    found.update({str(k): str(v) for k, v in reply.items()})
            except ResponseError:  # renamed, or denied by an ACL
                return None
            return found

        return await self.bounded(read, timeout_s)

    async def server_info(self, timeout_s: float | None = None) -> dict[str, Any]:
        """``INFO`` (every section): what a Redis that refuses CONFIG still tells."""
        return dict(await self.bounded(self.client.info, timeout_s))

    async def tenant_secret(self, timeout_s: float | None = None) -> bytes:
        """The key of the tenant hash, created once and shared by every replica."""

        async def get_or_create() -> bytes:
            await self.client.set(TENANT_SECRET_KEY, secrets.token_hex(32), nx=True)
            value = await self.client.get(TENANT_SECRET_KEY)
            if value is None:
                raise StoreUnavailable("tenant secret vanished")
            return value.encode() if isinstance(value, str) else bytes(value)

        return await self.bounded(get_or_create, timeout_s)

    # --- the request path ---

    async def load(self, keys: SessionKeys, tail: int) -> SessionState:
        """The session's state with its newest ``tail`` messages, in one round trip."""
        loaded = await self.load_turn(keys, tail)
        return loaded.state

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
        usage: bool = False,
    ) -> Loaded:
        """Everything one request needs, in one round trip: the session's meta, tiers,
        pins and pending jobs, and its log's messages after what the caller holds
        (``known``, up to ``most`` of them; else its newest ``tail``), with their vectors
        if asked; with a user, their cross-session profile and history; the same slice of
        each of ``peers``; and
        with ``usage``, the tenant's stored bytes.

        The returned state's ``tail`` holds the messages read: the caller that holds
        more puts its own tail there."""

        def build(pipe: Any) -> None:
            self._call_load(pipe, keys, tail, known, vectors, most)
            if user is not None:
                pipe.get(user.profile)
                pipe.lrange(user.history, 0, -1)
            for peer, held in peers:
                self._call_load(pipe, peer, 0, held, vectors, most)
            if usage:
                pipe.get(usage_key(keys.tenant))

        own, *rest = await self._scripted_pipeline(build)
        used = int(rest.pop() or 0) if usage else None
        meta, count, *_, tiers, pins, pending = own
        fields = _fields(meta)
        log = _log_slice(own, fields)
        profile, history = (rest.pop(0), rest.pop(0)) if user is not None else (None, [])
        user_id = fields.get(b"user_id")
        state = SessionState(
            message_count=int(count),
            tail=log.messages[-tail:] if tail > 0 else (),
            user_id=user_id.decode() if user_id else None,
            tiers=self._tiers.parse(keys, tiers),
            pins=tuple(Pin.from_data(codec.loads(p)) for p in pins),
            pending_jobs=int(pending),
            ended=b"ended" in fields,
            turns=int(fields.get(b"turns") or 0),
            exists=bool(meta),
            updated=float(fields.get(b"updated") or 0),
            profile=codec.loads(profile) if profile else None,
            history=tuple(codec.loads(h) for h in history),
        )
        peer_logs = {
            peer: _log_slice(reply, _fields(reply[0]))
            for (peer, _), reply in zip(peers, rest, strict=True)
        }
        return Loaded(state, log, peer_logs, used)

    def _call_load(
        self,
        pipe: Any,
        keys: SessionKeys,
        tail: int,
        known: Known | None,
        vectors: bool,
        most: int,
    ) -> None:
        names = (keys.meta, keys.log, keys.tiers, keys.pins, keys.jobs, keys.vec)
        generation, held = (known.generation, known.count) if known else ("", 0)
        args = (tail, generation, held, most, 1 if vectors else 0)
        pipe.evalsha(self._load.sha, len(names), *names, *args)

    async def archive_page(
        self, keys: SessionKeys, start: int, stop: int, *, vectors: bool
    ) -> tuple[str, int, tuple[Message, ...], tuple[bytes | None, ...]]:
        """Messages at positions ``start``..``stop`` (0-based, inclusive) with their
        vectors; and the log's generation and length as they were read with them."""

        def build(pipe: Any) -> None:
            names = (keys.meta, keys.log, keys.vec)
            args = (start, stop, 1 if vectors else 0)
            pipe.evalsha(self._archive_page.sha, len(names), *names, *args)

        ((generation, count, raw, offset, raw_vectors),) = await self._scripted_pipeline(build)
        messages, aligned = _slice(raw, int(offset), raw_vectors, start)
        return bytes(generation).decode(), int(count), messages, aligned

    async def messages_at(self, keys: SessionKeys, indexes: Sequence[int]) -> list[Message]:
        """Messages by index (recall hits), in the order asked; one round trip."""

        def build(pipe: Any) -> None:
            for index in indexes:
                pipe.lindex(keys.log, index - 1)

        raw = await self.pipeline(build) if indexes else []
        return [Message.from_json(r, i) for i, r in zip(indexes, raw, strict=True) if r]

    async def save_vectors(self, keys: SessionKeys, vectors: dict[int, bytes]) -> bool:
        """Store message vectors; False (nothing written) if the session no longer exists."""
        args: list[Any] = [self.retention_s]
        for index, vector in vectors.items():
            args += [str(index), vector]
        written = await self.bounded(
            lambda: self._save_vectors(keys=[keys.meta, keys.vectors], args=args)
        )
        return bool(written)

    async def vectors(self, keys: SessionKeys, indexes: Sequence[int]) -> dict[int, bytes]:
        raw: Any = await self.bounded(
            lambda: self.client.hmget(keys.vectors, [str(i) for i in indexes])
        )
        return {i: v for i, v in zip(indexes, raw, strict=True) if v}

    async def usage(self, tenant: str) -> int:
        """The bytes of messages a tenant has stored (what its quota counts)."""
        raw = await self.bounded(lambda: self.client.get(usage_key(tenant)))
        return int(raw or 0)

    async def user_history(self, user: UserKeys) -> list[dict[str, Any]]:
        raw = await self.bounded(lambda: self.client.lrange(user.history, 0, -1))
        return [json.loads(item) for item in raw]

    async def idle_sessions(self, user: UserKeys, *, idle_before: float, exclude: str) -> list[str]:
        """The user's sessions, still open, with no activity since ``idle_before`` (up to
        ``IDLE_BATCH`` of them)."""
        (found,) = await self.pipeline(lambda pipe: _ask_idle(pipe, user, idle_before))
        return [s for s in _idle(found) if s != exclude]

    async def save_user_history(
        self, user: UserKeys, entry: dict[str, Any], profile: dict[str, Any], keep: int
    ) -> None:
        """Append an ended session to the user's history and replace their profile."""

        def build(pipe: Any) -> None:
            pipe.lrem(user.history, 0, json.dumps(entry))  # an end repeated is one entry
            pipe.lpush(user.history, json.dumps(entry))
            pipe.ltrim(user.history, 0, keep - 1)
            pipe.set(user.profile, json.dumps(profile))
            for key in (user.history, user.profile):
                pipe.expire(key, self.retention_s)

        await self.pipeline(build)

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
        receipt: catalog.StoredReceipt | None = None,
        listed: bool = True,
        record_id: str = "",
        active: UserKeys | None = None,
    ) -> Recorded:
        """Append messages atomically, numbering them, with their recall ``vectors``
        (stored forms, "" for none; one per message, or none at all).

        In the same round trip: the ``predicted`` jobs and pins (written only where the
        append lands as predicted: ``Recorded.predicted``), the notices of those jobs, and
        the session ``joining`` its user's index, and the catalog's writes (the session and
        its tenant ``listed`` as active, this turn's ``receipt`` kept). A notice whose job was
        not written is harmless: a worker finds no such pending job and acknowledges it.

        Raises ``TailMoved`` when ``expected_count`` is given and the log has another length.
        """
        jobs = predicted.jobs if predicted else ()
        pins = predicted.pins if predicted else ()
        stored_vectors = list(vectors) if vectors else [b""] * len(messages)
        stored_json = [message.to_json() for message in messages]
        appended = sum(len(raw) for raw in stored_json)
        if len(stored_vectors) != len(messages):
            raise ValueError("one vector per message, or none")
        args: list[Any] = [
            self.retention_s,
            repr(now),
            keys.session_id,
            user_id or "",
            -1 if truncate_to is None else truncate_to,
            -1 if expected_count is None else expected_count,
            sum(1 for m in messages if m.role == "user"),
            len(messages),
            predicted.first if predicted else -1,
            predicted.turns if predicted else -1,
            len(jobs),
            len(pins),
            secrets.token_hex(8),
            appended,
            record_id,
            *stored_json,
            *stored_vectors,
            *(item for job in jobs for item in (job.id, json.dumps(job.to_data()))),
            *(item for pin in pins for item in (pin.id, json.dumps(pin.to_data()))),
        ]

        def build(pipe: Any) -> None:
            pipe.evalsha(self._record.sha, len(keys.all()), *keys.all(), *args)
            self._announce(pipe, keys, jobs)
            if joining is not None:
                self._add_user_session(pipe, joining.user, keys.session_id)
            if active is not None:  # this session's activity, for its user's idle check
                pipe.zadd(active.active, {keys.session_id: now})
                pipe.expire(active.active, self.retention_s)
            if joining is not None and joining.idle_before is not None:
                _ask_idle(pipe, joining.user, joining.idle_before)
            catalog.write_turn(
                pipe, keys, now=now, retention_s=self.retention_s, receipt=receipt, listed=listed
            )
            # Last, so that no reply above moves: the tenant's stored bytes (its quota).
            pipe.incrby(usage_key(keys.tenant), appended)
            pipe.expire(usage_key(keys.tenant), self.retention_s)

        # Only the script must succeed: the turn is recorded when it did. The rest may
        # have gone to other masters (a cluster): a notice lost with its master leaves
        # its job pending in the session, run with the session's next notice or flush;
        # a failed user index write is made again (or the turn reported degraded).
        replies = await self._scripted_pipeline(build, needed=1)
        first, count, turns, new_user, landed, generation, repeated = replies[0]
        if int(first) < 0:
            # Nothing was appended: the bytes counted beside the script are taken back.
            await self.bounded(lambda: self.client.decrby(usage_key(keys.tenant), appended))
            raise TailMoved(f"expected {expected_count} messages, found {count}")
        if int(repeated):  # done before, and its bytes counted then
            await self.bounded(lambda: self.client.decrby(usage_key(keys.tenant), appended))
        idle: tuple[str, ...] = ()
        if joining is not None:
            at = 1 + len(jobs)  # after the script and the notices
            indexed = replies[at : at + 2]
            if any(isinstance(reply, Exception) for reply in indexed):
                await self.index_user_session(joining.user, keys.session_id)
            if joining.idle_before is not None:
                found = replies[at + 2 + (2 if active is not None else 0)]
                if not isinstance(found, Exception):
                    idle = tuple(s for s in _idle(found) if s != keys.session_id)
        return Recorded(
            int(first),
            int(count),
            int(turns),
            bool(new_user),
            bool(landed),
            idle,
            bytes(generation).decode(),
        )

    async def _scripted_pipeline(
        self, build: Callable[[Any], None], *, needed: int | None = None
    ) -> list[Any]:
        """The request path's round trip: commands that call scripts by their sha (a
        pipeline of ``Script`` objects would ask the server whether they exist first:
        another round trip every time), sent on the request path's shared, pipelined
        connections (see ``connections``); replies are as Redis sent them.

        A server that lost its script cache (a restart) ran nothing of a failed script:
        the scripts are loaded and the whole pipeline sent again. The other commands of
        a pipeline built here must therefore be safe to repeat.

        An error reply raises ``StoreUnavailable``; past the first ``needed`` commands it
        is returned in its place instead (on a cluster, those may have gone to another
        master than the session's, which may be down while the session's is not).
        """
        # redis-py builds the commands (its pipeline's command stack); they are sent
        # below, not by the pipeline.
        pipe = self._commands.pipeline(transaction=False)
        build(pipe)
        commands = [args for args, _ in pipe.command_stack]

        async def run() -> list[Any]:
            # The connections keep the deadline: they know when Redis last answered.
            return await self._connections.execute(commands, self.timeout_s)

        replies = await self._guarded(run, build)
        if any(isinstance(reply, NoScriptError) for reply in replies):
            await self._load_scripts()
            replies = await self._guarded(run, build)
        for reply in replies[:needed]:
            if isinstance(reply, Exception):
                raise StoreUnavailable(f"redis: {type(reply).__name__}: {reply}")
        return replies

    async def send(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Commands of the store's neighbours on the request path (``rate_limits``): one
        round trip on the shared connections under the store's deadline; replies as Redis
        sent them, an error reply in its place."""

        async def send() -> list[Any]:
            return await self._connections.execute(commands, self.timeout_s)

        return await self._guarded(send, None)

    async def warm(self, timeout_s: float | None = None) -> None:
        """Start-up: the request path's scripts loaded and its connections open, so that
        a burst of first requests pays for neither inside its deadline."""
        await self._load_scripts(timeout_s)
        await self.bounded(self._connections.warm, timeout_s)

    async def _load_scripts(self, timeout_s: float | None = None) -> None:
        """Into an emptied script cache (a restart, SCRIPT FLUSH, a replica promoted in a
        cluster: scripts are not replicated), one round trip to each server."""
        commands = [("SCRIPT", "LOAD", script.script) for script in self._scripts]
        await self.bounded(lambda: self._connections.per_server(commands), timeout_s)

    async def enqueue(self, keys: SessionKeys, jobs: Sequence[Job]) -> None:
        """Remember the session's pending jobs and notify the workers (one round trip)."""

        def build(pipe: Any) -> None:
            pipe.hset(keys.jobs, mapping={job.id: json.dumps(job.to_data()) for job in jobs})
            pipe.expire(keys.jobs, self.retention_s)
            self._announce(pipe, keys, jobs)

        await self.pipeline(build)

    async def end_sessions(self, user: UserKeys, session_ids: Sequence[str], end: Job) -> None:
        """Queue the ``end`` job of each of a user's sessions, which leave the user's
        active index (a session that gets a turn again rejoins it); one round trip."""

        def build(pipe: Any) -> None:
            for session_id in session_ids:
                keys = SessionKeys(user.tenant, session_id)
                pipe.hset(keys.jobs, end.id, json.dumps(end.to_data()))
                pipe.expire(keys.jobs, self.retention_s)
                self._announce(pipe, keys, [end])
            pipe.zrem(user.active, *session_ids)

        if session_ids:
            await self.pipeline(build)

    def _announce(self, pipe: Any, keys: SessionKeys, jobs: Sequence[Job]) -> None:
        """The notices of a session's jobs, after the commands that made them pending."""
        for job in jobs:
            notice = {"tenant": keys.tenant, "sid": keys.session_id, "job": job.id}
            stream = job_stream(job_shard(keys, self.job_shards))
            pipe.xadd(stream, notice, maxlen=STREAM_MAXLEN, approximate=True)

    async def index_user_session(self, user: UserKeys, session_id: str) -> None:
        await self.pipeline(lambda pipe: self._add_user_session(pipe, user, session_id))

    def _add_user_session(self, pipe: Any, user: UserKeys, session_id: str) -> None:
        pipe.sadd(user.sessions, session_id)
        pipe.expire(user.sessions, self.retention_s)

    # --- the worker and the memory API ---

    async def tail(self, keys: SessionKeys, n: int) -> tuple[int, list[Message]]:
        """The session's message count and its newest ``n`` messages."""

        def build(pipe: Any) -> None:
            pipe.llen(keys.log)
            pipe.lrange(keys.log, -n, -1)

        count, raw = await self.pipeline(build)
        first = count - len(raw) + 1
        return int(count), [Message.from_json(r, first + i) for i, r in enumerate(raw)]

    async def messages(self, keys: SessionKeys, start: int, end: int) -> list[Message]:
        """Messages ``start``..``end`` (1-based, inclusive); ``end`` -1 means the last."""
        stop = end - 1 if end > 0 else -1
        raw = await self.bounded(lambda: self.client.lrange(keys.log, start - 1, stop))
        return [Message.from_json(item, start + i) for i, item in enumerate(raw)]

    async def job_state(self, keys: SessionKeys) -> tuple[bool, Tiers, list[Job]]:
        """Whether the session exists, its tiers, and its pending jobs (oldest first)."""

        def build(pipe: Any) -> None:
            pipe.exists(keys.meta)
            pipe.get(keys.tiers)
            pipe.hvals(keys.jobs)

        exists, tiers, raw_jobs = await self.pipeline(build)
        jobs = sorted(
            (Job.from_data(json.loads(j)) for j in raw_jobs), key=lambda j: (j.trigger, j.id)
        )
        return bool(exists), Tiers.from_json(tiers), jobs

    async def write_tiers(
        self, keys: SessionKeys, expected_version: int, tiers: Tiers, job: Job
    ) -> int:
        """Compare-and-set: 1 written, 0 someone wrote first, -1 the session is gone."""
        args: list[Any] = [expected_version, tiers.to_json(), job.id, self.retention_s]
        keys_ = [keys.meta, keys.tiers, keys.jobs]
        return int(await self.bounded(lambda: self._write_tiers(keys=keys_, args=args)))

    async def take_lease(self, keys: SessionKeys, holder: str, ttl_ms: int) -> bool:
        """One runner at a time per session: no duplicate summarizer calls, jobs in order."""
        taken = await self.bounded(lambda: self.client.set(keys.lease, holder, nx=True, px=ttl_ms))
        return bool(taken)

    async def release_lease(self, keys: SessionKeys, holder: str) -> None:
        await self.bounded(lambda: self._release(keys=[keys.lease], args=[holder]))

    async def finish_job(self, keys: SessionKeys, job: Job) -> None:
        await self.bounded(lambda: self.client.hdel(keys.jobs, job.id))

    async def add_pin(self, keys: SessionKeys, pin: Pin) -> None:
        def build(pipe: Any) -> None:
            pipe.hset(keys.pins, pin.id, json.dumps(pin.to_data()))
            pipe.expire(keys.pins, self.retention_s)

        await self.pipeline(build)

    async def delete_pin(self, keys: SessionKeys, pin_id: str) -> bool:
        return bool(await self.bounded(lambda: self.client.hdel(keys.pins, pin_id)))

    async def meta(self, keys: SessionKeys) -> dict[str, str]:
        raw: Any = await self.bounded(lambda: self.client.hgetall(keys.meta))
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def leave_active(self, user: UserKeys, session_id: str) -> None:
        """An ended session leaves its user's active index (a new turn brings it back)."""
        await self.bounded(lambda: self.client.zrem(user.active, session_id))

    async def end_session(self, keys: SessionKeys, now: float) -> bool:
        """Mark the session ended; False when it no longer exists (erased meanwhile)."""
        return bool(await self.bounded(lambda: self._end(keys=[keys.meta], args=[repr(now)])))

    async def erase_session(self, keys: SessionKeys) -> bool:
        """Delete every key of the session, and what its user's memory holds of it (and
        its bytes from its tenant's count)."""
        meta = await self.meta(keys)
        deleted: int = await self.bounded(lambda: self.client.delete(*keys.all()))
        if deleted and meta.get("bytes"):
            args = [int(meta["bytes"])]
            await self.bounded(
                lambda: self._release_usage(keys=[usage_key(keys.tenant)], args=args)
            )
        await self.pipeline(lambda pipe: catalog.forget_session(pipe, keys))
        if meta.get("user_id"):
            await self.forget_user_session(UserKeys(keys.tenant, meta["user_id"]), keys.session_id)
        return bool(deleted)

    async def forget_user_session(self, user: UserKeys, session_id: str) -> None:
        """Drop a session from its user's index and history. The profile was merged from
        it and cannot be un-merged: it goes too, and the user's next ended session
        rebuilds it from the history that is left."""
        raw: Any = await self.bounded(lambda: self.client.lrange(user.history, 0, -1))
        entries = [e for e in raw if json.loads(e).get("session_id") == session_id]

        def build(pipe: Any) -> None:
            pipe.srem(user.sessions, session_id)
            pipe.zrem(user.active, session_id)
            for entry in entries:
                pipe.lrem(user.history, 0, entry)
            if entries:
                pipe.delete(user.profile)

        await self.pipeline(build)

    async def user_sessions(self, user: UserKeys) -> list[str]:
        raw: Any = await self.bounded(lambda: self.client.smembers(user.sessions))
        return sorted(item.decode() for item in raw)

    async def erase_user(self, user: UserKeys) -> int:
        sessions = await self.user_sessions(user)
        for session_id in sessions:
            await self.erase_session(SessionKeys(user.tenant, session_id))
        await self.bounded(lambda: self.client.delete(*user.all()))
        return len(sessions)

    # --- the job stream ---

    async def ensure_group(self, shard: int) -> None:
        async def create() -> None:
            try:
                await self.client.xgroup_create(job_stream(shard), JOB_GROUP, id="0", mkstream=True)
            except ResponseError as error:
                if "BUSYGROUP" not in str(error):  # the group exists: fine
                    raise

        await self.bounded(create)

    async def read_jobs(
        self, shard: int, consumer: str, *, count: int, block_ms: int
    ) -> list[JobNotice]:
        stream = job_stream(shard)
        raw: Any = await self.bounded(
            lambda: self.client.xreadgroup(
                JOB_GROUP, consumer, {stream: ">"}, count=count, block=block_ms
            ),
            timeout_s=self.timeout_s + block_ms / 1000,
        )
        return [
            _notice(shard, entry, fields) for _, entries in raw or () for entry, fields in entries
        ]

    async def reclaim_jobs(
        self, shard: int, consumer: str, *, min_idle_ms: int, count: int
    ) -> list[JobNotice]:
        """Take over jobs a crashed consumer read but never acknowledged."""
        result: Any = await self.bounded(
            lambda: self.client.xautoclaim(
                job_stream(shard), JOB_GROUP, consumer, min_idle_ms, start_id="0-0", count=count
            )
        )
        return [_notice(shard, entry, fields) for entry, fields in result[1] if fields]

    async def ack_job(self, notice: JobNotice) -> None:
        stream = job_stream(notice.shard)

        def build(pipe: Any) -> None:
            pipe.xack(stream, JOB_GROUP, notice.entry_id)
            pipe.xdel(stream, notice.entry_id)

        await self.pipeline(build)

    async def close(self) -> None:
        await self.client.aclose()
        if not isinstance(self.client, RedisCluster):
            # A pool passed in explicitly is not closed by the client: close its sockets too.
            await self.client.connection_pool.disconnect()
        await self._connections.aclose()
