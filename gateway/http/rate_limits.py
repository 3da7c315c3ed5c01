"""Per-tenant and per-key rate limits (``limits``): requests a minute, tokens a minute and
requests in flight, counted in Redis so that every replica enforces the same numbers.

One script call admits a request: it checks every limit of the caller's tenant and key
and, only if all pass, counts the request and takes a lease on an in-flight slot. It goes
on the request path's shared, pipelined connections (``store.limits``): one round trip,
and none at all for a caller without limits (with ``limits`` all 0, the default, the
middleware is not installed). When the response is over, one more call, not awaited by
anyone, gives the slot back and charges the answer's tokens.

Windows are sliding: a minute's count is the current fixed minute's plus the previous
minute's weighted by how much of it the sliding minute still covers (two counters per
limit, whatever the rate; no burst of twice the limit at a minute's edge). A request is
refused while its count would pass the limit; tokens are charged after the answer, so the
request that uses the budget up is served and the next ones are refused until the window
has slid far enough. In-flight requests are a sorted set of lease ids scored by expiry:
a crashed process's leases lapse after ``limits.lease_s``.

Why not the ``limits`` library: its Redis storage keeps its own connection pool (not the
gateway's pipelined connections and deadlines), costs a round trip per limit and per
identifier, cannot check several limits in one atomic step (a tenant's count would be
taken for a request its key's limit then refuses), and has no concurrency limit.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth.authenticator import Authenticator, Caller, key_id
from gateway.config import RateLimit, Settings
from gateway.errors import REFUSAL_SPREAD_S, GatewayError, MemoryUnavailable, TooManyRequests
from gateway.observability import metrics, request_log
from gateway.service.ports import LimitStore
from gateway.store.keys import limit_counters, limit_scope
from gateway.store.redis_store import StoreUnavailable

if TYPE_CHECKING:
    from gateway.service.turn import Answered

log = logging.getLogger(__name__)

WINDOW_S = 60
# How long a refusal is repeated locally (see RateLimiter._refused): short beside any
# Retry-After the gateway sends (at least 1 s), so a slot freed meanwhile is soon seen.
REFUSAL_MEMO_S = 0.25
REFUSALS_KEPT = 10_000
# The name a gateway key's tenant has (``Authenticator._gateway_key``), before its name.
_GATEWAY_TENANT = "\x00gateway-tenant:"
# Paths whose requests count: the proxied API and the memory API.
LIMITED_PREFIXES = ("/v1/", "/memory/")
# An answer longer than this is estimated (4 characters a token), not tokenized: the
# charge is made on the event loop, after the response.
COUNTED_CHARS = 8_192

_REQUESTS, _TOKENS, _IN_FLIGHT = 1, 2, 3


@dataclass(frozen=True, slots=True)
class Limits:
    """One scope's limits (0: none)."""

    requests: int = 0  # a minute
    tokens: int = 0  # a minute
    in_flight: int = 0

    @classmethod
    def of(cls, config: RateLimit) -> Limits:
        return cls(config.requests_per_minute, config.tokens_per_minute, config.concurrent)

    def __bool__(self) -> bool:
        return bool(self.requests or self.tokens or self.in_flight)

    def tightest(self, other: Limits) -> Limits:
        """Each limit the lower of the two (0 counts as none)."""

        def lower(a: int, b: int) -> int:
            return min(a, b) if a and b else a or b

        return Limits(
            lower(self.requests, other.requests),
            lower(self.tokens, other.tokens),
            lower(self.in_flight, other.in_flight),
        )


@dataclass(frozen=True, slots=True)
class LimitScope:
    """What one set of counters belongs to: a tenant, or a key of it."""

    name: str  # "tenant" or "key": what a refusal says was reached
    prefix: str  # its keys' common part (the tenant's hash tag: one cluster slot)
    limits: Limits

    def keys(self, window: int) -> list[str]:
        return limit_counters(self.prefix, window)


class LimitPolicy:
    """Which limits apply to a caller (pure: from the config only)."""

    def __init__(self, settings: Settings) -> None:
        config = settings.limits
        self.keys_mode = settings.auth.mode == "keys"
        self.tenant = Limits.of(config.tenant)
        self.key = Limits.of(config.key)
        self.tenants = {
            name: Limits.of(config.tenant.over(o)) for name, o in config.tenants.items()
        }
        self.per_key = {
            key_id(k.key): Limits.of(config.key.over(k.limits))
            for k in settings.auth.keys
            if k.limits is not None
        }

    @property
    def active(self) -> bool:
        """Whether any caller has a limit (else the middleware is not installed)."""
        return bool(
            self.tenant or self.key or any(self.tenants.values()) or any(self.per_key.values())
        )

    def scopes(self, caller: Caller) -> list[LimitScope]:
        tenant = key_id(caller.tenant_name)  # forward mode: the key's own id
        if not self.keys_mode:
            # Each client key is its own tenant: one set of counters, the tighter limits.
            limits = self.tenant.tightest(self.key)
            return [LimitScope("tenant", limit_scope(tenant), limits)] if limits else []
        name = caller.tenant_name.removeprefix(_GATEWAY_TENANT)
        found = [
            LimitScope("tenant", limit_scope(tenant), self.tenants.get(name, self.tenant)),
            LimitScope(
                "key",
                limit_scope(tenant, caller.key_id),
                self.per_key.get(caller.key_id, self.key),
            ),
        ]
        return [scope for scope in found if scope.limits]


def window_of(now: float) -> tuple[int, float]:
    """The current minute's number and how far into it ``now`` is (seconds)."""
    window = int(now // WINDOW_S)
    return window, now - window * WINDOW_S


def retry_after_s(previous: int, current: int, limit: int, elapsed: float) -> int:
    """Whole seconds until a count refused at ``elapsed`` seconds into its minute would
    take one more (no further requests assumed): the sliding count is ``previous``,
    weighted by what the sliding minute still covers of its minute, plus ``current``."""
    room = limit - 1  # the sliding count may be at most this before one more is taken
    if current > room:
        # Only the next minute helps: there this minute's count is the weighted one.
        wait = (WINDOW_S - elapsed) + WINDOW_S * max(0.0, 1 - room / current)
    else:
        wait = WINDOW_S * (1 - (room - current) / previous) - elapsed if previous else 0.0
    return max(1, math.ceil(wait - 1e-6))  # not a second more for a float's last bit


def refusal(
    scope: LimitScope, kind: int, previous: int, current: int, elapsed: float
) -> TooManyRequests:
    """The 429 for a limit the script found reached (OpenAI's wording and headers)."""
    if kind == _IN_FLIGHT:
        return TooManyRequests(
            f"Too many requests in flight for this {scope.name}: limit "
            f"{scope.limits.in_flight}. Please try again once one has finished.",
            kind="requests",
            retry_after_s=1,
            limit_headers={},
        )
    limit = scope.limits.requests if kind == _REQUESTS else scope.limits.tokens
    unit, short, header = (
        ("requests", "RPM", "requests") if kind == _REQUESTS else ("tokens", "TPM", "tokens")
    )
    wait = retry_after_s(previous, current, limit, elapsed)
    return TooManyRequests(
        f"Rate limit reached for this {scope.name} on {unit} per min ({short}): "
        f"Limit {limit}. Please try again in {wait}s.",
        kind=unit,
        retry_after_s=wait,
        limit_headers={
            f"x-ratelimit-limit-{header}": str(limit),
            f"x-ratelimit-remaining-{header}": "0",
            f"x-ratelimit-reset-{header}": f"{wait}s",
        },
    )


@dataclass(slots=True)
class Lease:
    """An admitted request: what it holds, and the tokens to charge when it is over."""

    scopes: list[LimitScope]
    id: str
    tokens: int = 0
    pending: list[Callable[[], int]] = field(default_factory=list)  # counted after the response

    @property
    def counts_tokens(self) -> bool:
        return any(scope.limits.tokens for scope in self.scopes)


_CURRENT: ContextVar[Lease | None] = ContextVar("memory_gateway_lease", default=None)


def charge(answered: Answered) -> None:
    """Charge a chat turn's tokens to the request's limits (no-op without a token limit):
    the upstream's count when it gave one, else the context forwarded and the answer
    (counted after the response)."""
    lease = _CURRENT.get()
    if lease is None or not lease.counts_tokens:
        return
    prompt, answer = answered.prompt_tokens, answered.answer
    if answer is None and prompt is None:
        return  # the upstream answered nothing (a refused key, an error)
    lease.tokens += prompt if prompt is not None else answered.context_tokens
    if answered.completion_tokens is not None:
        lease.tokens += answered.completion_tokens
    elif answer is not None:
        payload, count = answer.to_openai(), answered.count
        lease.pending.append(lambda: _answer_tokens(payload, count))


def _answer_tokens(payload: dict[str, Any], count: Callable[[dict[str, Any]], int]) -> int:
    content = payload.get("content")
    size = len(content) if isinstance(content, str) else len(str(payload))
    if size > COUNTED_CHARS:
        return size // 4
    return count(payload)


class RateLimiter:
    """Admits requests against their caller's limits and gives their slots back."""

    def __init__(
        self,
        store: LimitStore,
        policy: LimitPolicy,
        *,
        lease_s: float,
        fail_closed: bool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.policy = policy
        self.lease_s = lease_s
        self.fail_closed = fail_closed
        self.clock = clock
        self._releasing: set[asyncio.Task[None]] = set()
        # Callers refused a moment ago, refused again without asking Redis until then: a
        # client hammering past its limit (reconnecting after every 429) costs one dict
        # lookup a request, not a round trip. (scopes' prefixes -> until, the refusal.)
        self._refused: dict[tuple[str, ...], tuple[float, tuple[int, int, int, int]]] = {}

    async def admit(self, caller: Caller) -> Lease | None:
        """A lease for the request (None: nothing limits this caller, or Redis is down and
        ``redis.on_failure`` is open); ``TooManyRequests`` when a limit is reached."""
        scopes = self.policy.scopes(caller)
        if not scopes:
            return None
        now = self.clock()
        window, elapsed = window_of(now)
        who = tuple(scope.prefix for scope in scopes)
        refused = self._refused.get(who)
        if refused is not None:
            if now < refused[0]:
                at, kind, previous, current = refused[1]
                raise refusal(scopes[at], kind, previous, current, elapsed)
            del self._refused[who]
        lease = Lease(scopes, os.urandom(8).hex())
        limits: list[int] = []
        for scope in scopes:
            limits += [scope.limits.requests, scope.limits.tokens, scope.limits.in_flight]
        args = [
            repr(1 - elapsed / WINDOW_S),
            repr(now),
            lease.id,
            repr(now + self.lease_s),
            2 * WINDOW_S,
            math.ceil(self.lease_s),
            *limits,
        ]
        try:
            # Every scope at once, in one script call (``store/scripts/admit.lua``).
            reply = await self.store.admit([scope.prefix for scope in scopes], window, args)
        except StoreUnavailable as error:
            if self.fail_closed:
                raise MemoryUnavailable(
                    "rate limits cannot be checked (memory store unavailable); the gateway "
                    "is configured to fail closed"
                ) from None
            log.warning("rate limits not checked for this request: %s", error)
            metrics.degraded("rate_limits_unavailable")
            return None
        if int(reply[0]) < 0:
            return lease
        at, kind, previous, current = (int(v) for v in reply[:4])
        refused_now = refusal(scopes[at], kind, previous, current, elapsed)
        if len(self._refused) >= REFUSALS_KEPT:
            self._refused.clear()  # (a burst of distinct callers: start again)
        self._refused[who] = (now + REFUSAL_MEMO_S, (at, kind, previous, current))
        raise refused_now

    def release(self, lease: Lease) -> None:
        """Give the lease's slots back and charge its tokens, in the background."""
        task = asyncio.ensure_future(self._release(lease))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release(self, lease: Lease) -> None:
        self._refused.pop(tuple(scope.prefix for scope in lease.scopes), None)  # a slot is free
        tokens = lease.tokens + sum(count() for count in lease.pending)
        window, _ = window_of(self.clock())
        in_flight = [scope.prefix for scope in lease.scopes if scope.limits.in_flight]
        charged = [scope.prefix for scope in lease.scopes if scope.limits.tokens and tokens > 0]
        if not in_flight and not charged:
            return
        try:
            await self.store.release(
                lease.id,
                in_flight=in_flight,
                charged=charged,
                window=window,
                tokens=tokens,
                ttl_s=2 * WINDOW_S,
            )
        except StoreUnavailable as error:
            # The lease lapses by itself (limits.lease_s); the tokens go uncounted.
            log.warning("rate-limit lease not released: %s", error)


class RateLimitMiddleware:
    """Admits each request to the proxied API and the memory API against its caller's
    limits, before the route does any work, and holds its slot until the response is
    over (a stream's last byte). Requests without a valid key pass on: their route
    answers 401."""

    def __init__(self, app: ASGIApp, *, limiter: RateLimiter, auth: Authenticator) -> None:
        self.app = app
        self.limiter = limiter
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(LIMITED_PREFIXES):
            await self.app(scope, receive, send)
            return
        try:
            caller = self.auth.identify(Headers(scope=scope))
            lease = await self.limiter.admit(caller)
        except TooManyRequests as error:
            request_log.note(rate_limited=error.type)
            # Answered after a random part of a second: refusals that arrive together (a
            # client's connections reopened at once, its kept-alive ones timing out
            # together) then end apart, and its retries with them, instead of coming back
            # as one burst that every other client's requests wait behind.
            await asyncio.sleep(random.uniform(0, REFUSAL_SPREAD_S))
            await _error_response(error)(scope, receive, send)
            return
        except MemoryUnavailable as error:
            await _error_response(error)(scope, receive, send)
            return
        except GatewayError:  # not a key: the route says so
            lease = None
        if lease is None:
            await self.app(scope, receive, send)
            return
        token = _CURRENT.set(lease)
        try:
            await self.app(scope, receive, send)
        finally:
            _CURRENT.reset(token)
            self.limiter.release(lease)


def _error_response(error: GatewayError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.response_headers())


def rate_limiter(
    settings: Settings, store: LimitStore, clock: Callable[[], float] = time.time
) -> RateLimiter | None:
    """The gateway's limiter, or None when no limit is configured (no cost at all)."""
    policy = LimitPolicy(settings)
    if not policy.active:
        return None
    return RateLimiter(
        store,
        policy,
        lease_s=settings.limits.lease_s,
        fail_closed=settings.redis.on_failure == "closed",
        clock=clock,
    )
