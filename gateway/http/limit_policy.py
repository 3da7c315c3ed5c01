"""Which rate limits apply to a caller, and what a refusal says (pure: from the config and
the counts ``store/scripts/admit.lua`` and ``limit_reserve.lua`` return). The limiter and
the middleware that use them are ``rate_limits``.

A caller's scopes: its tenant's and, in ``keys`` mode, its key's (one cluster slot, the
tenant's), and its client address's (``limits.address``, in the address's own slot).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.auth.authenticator import Caller, key_id
from gateway.config import RateLimit, Settings
from gateway.errors import TooManyRequests
from gateway.http.server import TrustedProxies, client_address
from gateway.store.keys import limit_address, limit_counters, limit_scope

WINDOW_S = 60
# The name a gateway key's tenant has (``Authenticator._gateway_key``), before its name.
_GATEWAY_TENANT = "\x00gateway-tenant:"
# The limit a script's refusal names.
REQUESTS, TOKENS, IN_FLIGHT = 1, 2, 3


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
    """What one set of counters belongs to: a tenant, a key of it, or a client address."""

    name: str  # "tenant", "key" or "address": what a refusal says was reached
    prefix: str  # its keys' common part (its hash tag: one cluster slot)
    limits: Limits

    def keys(self, window: int) -> list[str]:
        return limit_counters(self.prefix, window)

    @property
    def slot(self) -> str:
        """Its hash tag: scopes with the same one are checked by one script call."""
        return self.prefix.partition("}")[0]


def groups_of(scopes: list[LimitScope]) -> list[list[LimitScope]]:
    """``scopes`` by their slot, in their order (a tenant's and its key's, an address's)."""
    groups: dict[str, list[LimitScope]] = {}
    for scope in scopes:
        groups.setdefault(scope.slot, []).append(scope)
    return list(groups.values())


class LimitPolicy:
    """Which limits apply to a caller (pure: from the config only)."""

    def __init__(self, settings: Settings) -> None:
        config = settings.limits
        self.keys_mode = settings.auth.mode == "keys"
        self.tenant = Limits.of(config.tenant)
        self.key = Limits.of(config.key)
        self.address = Limits.of(config.address)
        self.tenants = {
            name: Limits.of(config.tenant.over(o)) for name, o in config.tenants.items()
        }
        self.per_key = {
            key_id(k.key): Limits.of(config.key.over(k.limits))
            for k in settings.auth.keys
            if k.limits is not None
        }
        # Exempt from the address's limits, as from the connection cap (http/server.py).
        self.trusted = TrustedProxies(tuple(settings.server.trusted_proxies))

    @property
    def active(self) -> bool:
        """Whether any caller has a limit (else the middleware is not installed)."""
        return bool(
            self.tenant
            or self.key
            or self.address
            or any(self.tenants.values())
            or any(self.per_key.values())
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

    def address_scopes(self, host: str | None) -> list[LimitScope]:
        """The client address's scope (none without ``limits.address``, for a trusted
        proxy, or when the server does not know the client's address)."""
        if not self.address or host is None or host in self.trusted:
            return []
        return [LimitScope("address", limit_address(client_address(host)), self.address)]


def window_of(now: float) -> tuple[int, float]:
    """The current minute's number and how far into it ``now`` is (seconds)."""
    window = int(now // WINDOW_S)
    return window, now - window * WINDOW_S


def retry_after_s(previous: int, current: int, limit: int, elapsed: float, need: int = 1) -> int:
    """Whole seconds until a count refused at ``elapsed`` seconds into its minute would
    take ``need`` more (no further requests assumed): the sliding count is ``previous``,
    weighted by what the sliding minute still covers of its minute, plus ``current``."""
    room = max(0, limit - need)  # the sliding count may be at most this before it fits
    if current > room:
        # Only the next minute helps: there this minute's count is the weighted one.
        wait = (WINDOW_S - elapsed) + WINDOW_S * max(0.0, 1 - room / current)
    else:
        wait = WINDOW_S * (1 - (room - current) / previous) - elapsed if previous else 0.0
    return max(1, math.ceil(wait - 1e-6))  # not a second more for a float's last bit


def refusal(
    scope: LimitScope, kind: int, previous: int, current: int, elapsed: float, need: int = 1
) -> TooManyRequests:
    """The 429 for a limit the script found reached (OpenAI's wording and headers);
    ``need``: the tokens a refused reservation asked for."""
    if kind == IN_FLIGHT:
        return TooManyRequests(
            f"Too many requests in flight for this {scope.name}: limit "
            f"{scope.limits.in_flight}. Please try again once one has finished.",
            kind="requests",
            retry_after_s=1,
            limit_headers={},
        )
    limit = scope.limits.requests if kind == REQUESTS else scope.limits.tokens
    unit, short, header = (
        ("requests", "RPM", "requests") if kind == REQUESTS else ("tokens", "TPM", "tokens")
    )
    wait = retry_after_s(previous, current, limit, elapsed, need)
    used = ""
    if need > 1:  # as OpenAI says it of a request that does not fit
        counted = math.ceil(previous * (1 - elapsed / WINDOW_S) + current)
        used = f", Used {counted}, Requested {need}"
    return TooManyRequests(
        f"Rate limit reached for this {scope.name} on {unit} per min ({short}): "
        f"Limit {limit}{used}. Please try again in {wait}s.",
        kind=unit,
        retry_after_s=wait,
        limit_headers={
            f"x-ratelimit-limit-{header}": str(limit),
            f"x-ratelimit-remaining-{header}": "0",
            f"x-ratelimit-reset-{header}": f"{wait}s",
        },
    )
