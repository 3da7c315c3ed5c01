"""The Redis store: one round trip to load a session, one atomic script to record a turn.

Every call runs under a short deadline (``redis.timeout_ms``): redis-py's own defaults take
seconds to notice a dead server, and the gateway must answer first. A missed deadline or
any connection error surfaces as ``StoreUnavailable``; the route decides between
fail-open and fail-closed.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.memory.model import Message, SessionState
from gateway.store.keys import TENANT_SECRET_KEY, SessionKeys

T = TypeVar("T")


class StoreUnavailable(Exception):
    """Redis did not answer in time, or answered with an error."""


# KEYS: meta, log.  ARGV: ttl_s, now, session_id, user_id ("" = keep), truncate_to
# (-1 = none), expected_count, message JSON...
# Appends after an optional truncation (a regenerate replacing the stored answer) in one
# step, so concurrent turns never interleave and a reader never sees half a turn. The
# truncation only happens if the log still has the length the request saw: if another
# turn landed meanwhile, the new answer is appended instead of deleting someone's turn.
RECORD_SCRIPT = """
local n = redis.call('LLEN', KEYS[2])
local truncate_to = tonumber(ARGV[5])
if truncate_to >= 0 and n == tonumber(ARGV[6]) then
  while n > truncate_to do
    redis.call('RPOP', KEYS[2])
    n = n - 1
  end
end
local first = n + 1
if #ARGV >= 7 then
  n = redis.call('RPUSH', KEYS[2], unpack(ARGV, 7))
end
redis.call('HSET', KEYS[1], 'sid', ARGV[3], 'updated', ARGV[2])
redis.call('HSETNX', KEYS[1], 'created', ARGV[2])
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'user_id', ARGV[4])
end
local ttl = tonumber(ARGV[1])
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
return {first, n}
"""


def create_client(url: str, *, timeout_s: float, max_connections: int) -> redis.Redis:
    """A client that fails within the deadline instead of redis-py's seconds of retries.

    A blocking pool waits for a free connection instead of raising "Too many connections"
    under load; the deadline around each call bounds that wait too.
    """
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )
    return redis.Redis(connection_pool=pool)


class RedisStore:
    """Session memory in Redis, every call bounded by the configured deadline."""

    def __init__(self, client: redis.Redis, *, timeout_s: float, retention_s: int) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.retention_s = retention_s
        self._record = client.register_script(RECORD_SCRIPT)

    async def _bounded(self, call: Callable[[], Awaitable[T]], timeout_s: float | None = None) -> T:
        try:
            async with asyncio.timeout(timeout_s or self.timeout_s):
                return await call()
        except (TimeoutError, RedisError, OSError) as error:
            raise StoreUnavailable(f"redis: {type(error).__name__}: {error}") from error

    async def ping(self, timeout_s: float | None = None) -> None:
        await self._bounded(self.client.ping, timeout_s)

    async def tenant_secret(self, timeout_s: float | None = None) -> bytes:
        """The key of the tenant hash, created once and shared by every replica."""

        async def get_or_create() -> bytes:
            await self.client.set(TENANT_SECRET_KEY, secrets.token_hex(32), nx=True)
            value = await self.client.get(TENANT_SECRET_KEY)
            if value is None:
                raise StoreUnavailable("tenant secret vanished")
            return value.encode() if isinstance(value, str) else bytes(value)

        return await self._bounded(get_or_create, timeout_s)

    async def load(self, keys: SessionKeys, tail: int) -> SessionState:
        """The session's size, user and newest ``tail`` messages, in one round trip."""

        async def read() -> list[Any]:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.hgetall(keys.meta)
                pipe.llen(keys.log)
                pipe.lrange(keys.log, -tail, -1)
                return await pipe.execute()

        meta, count, raw = await self._bounded(read)
        first = count - len(raw) + 1
        messages = tuple(Message.from_json(item, first + i) for i, item in enumerate(raw))
        user = meta.get(b"user_id")
        return SessionState(
            message_count=int(count),
            tail=messages,
            user_id=user.decode() if user else None,
        )

    async def record(
        self,
        keys: SessionKeys,
        messages: Sequence[Message],
        *,
        now: float,
        user_id: str | None,
        truncate_to: int | None = None,
        expected_count: int = 0,
    ) -> tuple[int, int]:
        """Append messages atomically; returns (index of the first, new message count)."""
        args: list[Any] = [
            self.retention_s,
            repr(now),
            keys.session_id,
            user_id or "",
            -1 if truncate_to is None else truncate_to,
            expected_count,
            *(message.to_json() for message in messages),
        ]
        first, count = await self._bounded(lambda: self._record(keys=list(keys.all()), args=args))
        return int(first), int(count)

    async def close(self) -> None:
        await self.client.aclose()
        # A pool passed in explicitly is not closed by the client: close its sockets too.
        await self.client.connection_pool.disconnect()
