"""Per-tenant, per-key and per-address rate limits (``limits``): requests a minute,
tokens a minute and requests in flight, counted in Redis so that every replica enforces
the same numbers.

One script call admits a request: it checks every limit of the caller's tenant and key
(which apply, and what a refusal says: ``limit_policy``) and, only if all pass, counts
the request and takes a lease on an in-flight slot. It goes on the request path's
shared, pipelined connections (``store.limits``): one round trip, and none at all for a
caller without limits (with ``limits`` all 0, the default, the middleware is not
installed). When the response is over, one more call, not awaited by anyone, gives the
slot back and settles the request's tokens.

Tokens are reserved before anything is forwarded, and settled after. A caller with a
token limit pays a second round trip, made by the route once it knows what it will send
(``reserve``): a memory turn's context as the gateway counted it, any other request's
body by ``token_costs`` (a token every 4 bytes, an inline image at its cost). One script
refuses the reservation when the minute's count plus it would pass a limit, or adds it to
the count; so 20 requests sent at once against 3,000 tokens a minute forward about 3,000
tokens' worth between them, not 20 prompts. A prompt larger than the whole budget is
served alone, into an empty minute. When the answer is over, the reservation is settled
to what it took: the upstream's ``usage`` (a memory turn's as the dialect read it, any
other answer's from its last bytes, asked for uncompressed: ``token_costs.Tail``), else
the gateway's count of a memory turn's context and answer; more is charged, less given
back (to the minute the reservation was taken in). An answer that says nothing (no
``usage``, an error) leaves the reservation standing. Every proxied request is so
charged: memory turns, memory off, without a session, and the passthrough's endpoints
(embeddings, completions, ...).

``limits.address`` holds each client address (IPv6: its /64, as the server counts its
connections) whatever key it sends, in both auth modes: in ``forward`` mode every key is
its own tenant, so a client rotating keys gets fresh tenant limits with each one, but
not a fresh address. ``server.trusted_proxies`` are exempt, as from the connection cap
(behind one, a client's address is the one the proxy names). An address's counters
are in their own cluster slot: its script call goes in the same round trip as the
tenant's, and a request one of them refuses is taken off the other's counts.

Windows are sliding: a minute's count is the current fixed minute's plus the previous
minute's weighted by how much of it the sliding minute still covers (two counters per
limit, whatever the rate; no burst of twice the limit at a minute's edge). A request is
refused while its count would pass the limit. In-flight requests are a sorted set of
lease ids scored by expiry: a crashed process's leases lapse after ``limits.lease_s``
(its reservations stand, and slide out of the window).

Why not the ``limits`` library: its Redis storage keeps its own connection pool (not the
gateway's pipelined connections and deadlines), costs a round trip per limit and per
identifier, cannot check several limits in one atomic step (a tenant's count would be
taken for a request its key's limit then refuses), and has no concurrency limit nor
reservation.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth.authenticator import Authenticator, Caller
from gateway.config import Settings
from gateway.errors import GatewayError, MemoryUnavailable, TooManyRequests
from gateway.http.limit_policy import (
    WINDOW_S,
    LimitPolicy,
    LimitScope,
    groups_of,
    refusal,
    window_of,
)
from gateway.http.refusals import error_response, refuse
from gateway.http.token_costs import Tail
from gateway.observability import metrics, request_log
from gateway.service.ports import LimitStore
from gateway.store.redis_store import StoreUnavailable

if TYPE_CHECKING:
    from gateway.service.turn import Answered

log = logging.getLogger(__name__)

# How long a refusal is repeated locally (see RateLimiter._refused): short beside any
# Retry-After the gateway sends (at least 1 s), so a slot freed meanwhile is soon seen.
REFUSAL_MEMO_S = 0.25
REFUSALS_KEPT = 10_000
# Paths whose requests count: the proxied API, the memory API and its MCP server.
LIMITED_PREFIXES = ("/v1/", "/memory/", "/mcp")
# An answer longer than this is estimated (4 characters a token), not tokenized: the
# charge is made on the event loop, after the response.
COUNTED_CHARS = 8_192


@dataclass(slots=True)
class Lease:
    """An admitted request: what it holds, what it reserved, and what it took."""

    scopes: list[LimitScope]
    id: str
    limiter: RateLimiter | None = None  # (None: a test's lease, never reserved)
    # What the answer took, once known (``measured``): the tokens counted so far, and
    # those to count after the response.
    tokens: int = 0
    pending: list[Callable[[], int]] = field(default_factory=list)
    measured: bool = False
    # The prompt's tokens reserved, in the minute they were.
    reserved: int = 0
    reserved_window: int = 0

    @property
    def counts_tokens(self) -> bool:
        return any(scope.limits.tokens for scope in self.scopes)

    @property
    def groups(self) -> list[list[LimitScope]]:
        return groups_of(self.scopes)

    def took(self, tokens: int) -> None:
        """What the answer took, all told (the upstream's usage)."""
        self.tokens, self.pending, self.measured = tokens, [], True

    def settlement(self) -> int:
        """Tokens to charge beyond the reservation (negative: to give back); 0 when the
        answer said nothing (the reservation stands)."""
        if not self.measured:
            return 0
        return self.tokens + sum(count() for count in self.pending) - self.reserved


_CURRENT: ContextVar[Lease | None] = ContextVar("memory_gateway_lease", default=None)


def counting_tokens() -> bool:
    """Whether the request being served has a token limit (else reserving and reading
    usage are skipped: no cost)."""
    lease = _CURRENT.get()
    return lease is not None and lease.counts_tokens


async def reserve(tokens: int) -> None:
    """Reserve the request's prompt ``tokens`` before it is forwarded (no-op without a
    token limit); ``TooManyRequests`` when they would pass a limit."""
    lease = _CURRENT.get()
    if lease is None or lease.limiter is None or not lease.counts_tokens:
        return
    try:
        await lease.limiter.reserve(lease, tokens)
    except TooManyRequests as error:
        request_log.note(rate_limited=error.type)
        raise


def charge(answered: Answered) -> None:
    """Charge a chat turn's tokens to the request's limits (no-op without a token limit):
    the upstream's count when it gave one, else the context forwarded and the answer
    (counted after the response)."""
    lease = _CURRENT.get()
    if lease is None or not lease.counts_tokens:
        return
    prompt, answer = answered.prompt_tokens, answered.answer
    if answer is None and prompt is None:
        return  # the upstream answered nothing (a refused key, an error): it stands
    lease.measured = True
    lease.tokens += prompt if prompt is not None else answered.context_tokens
    if answered.completion_tokens is not None:
        lease.tokens += answered.completion_tokens
    elif answer is not None:
        payload, count = answer.to_openai(), answered.count
        lease.pending.append(lambda: _answer_tokens(payload, count))


def metered(body: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """``body`` (an answer relayed as it came), its usage charged once it has ended
    (``body`` itself without a token limit)."""
    lease = _CURRENT.get()
    if lease is None or not lease.counts_tokens:
        return body
    return _metered(body, lease)


async def _metered(body: AsyncGenerator[bytes, None], lease: Lease) -> AsyncGenerator[bytes, None]:
    tail = Tail()
    try:
        async for chunk in body:
            tail.add(chunk)
            yield chunk
    finally:
        await body.aclose()  # (the upstream closed however it ended)
    # A whole answer: what it says it took (an answer cut short leaves the reservation).
    used = tail.tokens()
    if used is not None:
        lease.took(used)


def _answer_tokens(payload: dict[str, Any], count: Callable[[dict[str, Any]], int]) -> int:
    content = payload.get("content")
    size = len(content) if isinstance(content, str) else len(str(payload))
    if size > COUNTED_CHARS:
        return size // 4
    return count(payload)


def _limits(group: list[LimitScope]) -> list[int]:
    return [n for s in group for n in (s.limits.requests, s.limits.tokens, s.limits.in_flight)]


def _prefixes(group: list[LimitScope]) -> tuple[str, ...]:
    return tuple(scope.prefix for scope in group)


class RateLimiter:
    """Admits requests against their caller's limits, reserves their prompts' tokens, and
    gives their slots back."""

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
        self._releasing: set[asyncio.Future[Any]] = set()
        # Groups of scopes refused a moment ago, refused again without asking Redis until
        # then: a client hammering past its limit (reconnecting after every 429) costs one
        # dict lookup a request, not a round trip. (prefixes -> until, the refusal.)
        self._refused: dict[tuple[str, ...], tuple[float, tuple[int, int, int, int]]] = {}

    async def admit(self, caller: Caller, host: str | None = None) -> Lease | None:
        """A lease for the request of ``caller`` from client address ``host`` (None:
        nothing limits this caller, or Redis is down and ``redis.on_failure`` is open);
        ``TooManyRequests`` when a limit is reached."""
        scopes = self.policy.scopes(caller) + self.policy.address_scopes(host)
        if not scopes:
            return None
        now = self.clock()
        window, elapsed = window_of(now)
        groups = groups_of(scopes)
        for group in groups:
            self._refuse_again(group, now, elapsed)
        lease = Lease(scopes, os.urandom(8).hex(), self)
        common = [
            repr(1 - elapsed / WINDOW_S),
            repr(now),
            lease.id,
            repr(now + self.lease_s),
            2 * WINDOW_S,
            math.ceil(self.lease_s),
        ]
        try:
            # Every scope of a slot in one script call (``store/scripts/admit.lua``); the
            # slots' calls in one round trip.
            replies = await self.store.admit(
                [(_prefixes(group), [*common, *_limits(group)]) for group in groups], window
            )
        except StoreUnavailable as error:
            self._unavailable(error)
            return None
        refused = [
            (group, reply)
            for group, reply in zip(groups, replies, strict=True)
            if int(reply[0]) >= 0
        ]
        if not refused:
            return lease
        admitted = [
            s for g, reply in zip(groups, replies, strict=True) if int(reply[0]) < 0 for s in g
        ]
        if admitted:  # (another slot's refusal): not counted there either
            self._background(
                self.store.release(
                    lease.id,
                    in_flight=[s.prefix for s in admitted if s.limits.in_flight],
                    charged=[],
                    window=window,
                    tokens=0,
                    ttl_s=2 * WINDOW_S,
                    uncounted=[s.prefix for s in admitted if s.limits.requests],
                )
            )
        group, reply = refused[0]
        at, kind, previous, current = (int(v) for v in reply[:4])
        if len(self._refused) >= REFUSALS_KEPT:
            self._refused.clear()  # (a burst of distinct callers: start again)
        self._refused[_prefixes(group)] = (now + REFUSAL_MEMO_S, (at, kind, previous, current))
        raise refusal(group[at], kind, previous, current, elapsed)

    def _refuse_again(self, group: list[LimitScope], now: float, elapsed: float) -> None:
        """Raise the refusal of ``group`` made a moment ago, if there was one."""
        who = _prefixes(group)
        refused = self._refused.get(who)
        if refused is None:
            return
        if now < refused[0]:
            at, kind, previous, current = refused[1]
            raise refusal(group[at], kind, previous, current, elapsed)
        del self._refused[who]

    async def reserve(self, lease: Lease, tokens: int) -> None:
        """Raise ``lease``'s reservation to ``tokens`` (at most its largest token limit:
        more refuses nothing more), checked against every token limit at once;
        ``TooManyRequests`` (nothing reserved) when it would pass one."""
        limited = [scope for scope in lease.scopes if scope.limits.tokens]
        tokens = min(tokens, max((scope.limits.tokens for scope in limited), default=0))
        more = tokens - lease.reserved
        if more <= 0:
            return
        now = self.clock()
        window, elapsed = window_of(now)
        groups = groups_of(limited)
        common = [repr(1 - elapsed / WINDOW_S), more, 2 * WINDOW_S]
        try:
            replies = await self.store.reserve(
                [(_prefixes(g), [*common, *(s.limits.tokens for s in g)]) for g in groups],
                window,
            )
        except StoreUnavailable as error:
            self._unavailable(error)
            return
        refused = [
            (group, reply)
            for group, reply in zip(groups, replies, strict=True)
            if int(reply[0]) >= 0
        ]
        if not refused:
            # (A second reservation in a later minute moves the whole one there: its
            # give-back is then made in that minute.)
            lease.reserved, lease.reserved_window = tokens, window
            return
        taken = [
            s.prefix
            for g, reply in zip(groups, replies, strict=True)
            if int(reply[0]) < 0
            for s in g
        ]
        if taken:  # (another slot's refusal): given back there
            self._background(
                self.store.release(
                    lease.id,
                    in_flight=[],
                    charged=taken,
                    window=window,
                    tokens=-more,
                    ttl_s=2 * WINDOW_S,
                )
            )
        group, reply = refused[0]
        at, kind, previous, current = (int(v) for v in reply[:4])
        scope = group[at]
        raise refusal(scope, kind, previous, current, elapsed, min(more, scope.limits.tokens))

    def _unavailable(self, error: StoreUnavailable) -> None:
        """Redis did not answer: 503 when failing closed, else served uncounted."""
        if self.fail_closed:
            raise MemoryUnavailable(
                "rate limits cannot be checked (memory store unavailable); the gateway "
                "is configured to fail closed"
            ) from None
        log.warning("rate limits not checked for this request: %s", error)
        metrics.degraded("rate_limits_unavailable")

    def release(self, lease: Lease) -> None:
        """Give the lease's slots back and settle its tokens, in the background."""
        self._background(self._release(lease))

    def _background(self, call: Awaitable[None]) -> None:
        task = asyncio.ensure_future(self._quietly(call))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    @staticmethod
    async def _quietly(call: Awaitable[None]) -> None:
        try:
            await call
        except StoreUnavailable as error:
            # Leases lapse by themselves (limits.lease_s); the tokens go unsettled.
            log.warning("rate-limit lease not released: %s", error)

    async def _release(self, lease: Lease) -> None:
        for group in lease.groups:
            self._refused.pop(_prefixes(group), None)  # a slot is free
        window, _ = window_of(self.clock())
        tokens = lease.settlement()
        if tokens < 0 and lease.reserved_window < window - 1:
            tokens = 0  # the reservation's minute no longer counts: nothing to give back
        in_flight = [scope.prefix for scope in lease.scopes if scope.limits.in_flight]
        charged = [scope.prefix for scope in lease.scopes if scope.limits.tokens and tokens]
        if not in_flight and not charged:
            return
        await self.store.release(
            lease.id,
            in_flight=in_flight,
            charged=charged,
            # More is charged to this minute; what is given back, to the reservation's.
            window=window if tokens > 0 else lease.reserved_window,
            tokens=tokens,
            ttl_s=2 * WINDOW_S,
        )


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
        client = scope.get("client")
        try:
            caller = self.auth.identify(Headers(scope=scope))
            lease = await self.limiter.admit(caller, client[0] if client else None)
        except TooManyRequests as error:
            await refuse(error, scope, receive, send)
            return
        except MemoryUnavailable as error:
            await error_response(error)(scope, receive, send)
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
