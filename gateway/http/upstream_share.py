"""Each tenant's share of the upstream pool (``upstream.tenant_share``), in one process.

The upstream pool (``upstream.max_connections``) is every tenant's: one tenant's streams,
held long (a slow model, a client that reads slowly or not at all), could otherwise take
all of it, and every other tenant's requests would wait out ``pool_s`` and get 503 (three
client addresses, 750 streams: the per-address connection cap did not stop one tenant).

The rule is work-conserving, as Envoy's and nginx's per-downstream limits are meant to
be used: a tenant may go past its share (``tenant_share`` of the pool) only while more
than a share of the pool is free. Alone on an idle gateway a tenant gets three quarters
of the pool (at the default 0.25); however many tenants hold their full shares, a
tenant holding less always finds a free share's worth of room. A request past it gets
429 (OpenAI's envelope, ``Retry-After: 1``, after a random part of a second as every
refusal), before the route reads its body.

Counted in this process only, with no round trip: it protects this process's pool, which
is what one tenant can exhaust. ``limits.tenant.concurrent`` is the limit across
replicas (counted in Redis). The count is a request to ``/v1/`` (every one goes upstream)
from when it is admitted until its response's last byte.
"""

from __future__ import annotations

import math

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth.authenticator import Authenticator, key_id
from gateway.errors import GatewayError, TooManyRequests
from gateway.http.refusals import refuse

UPSTREAM_PREFIX = "/v1/"


class UpstreamShares:
    """Who holds how much of the pool (pure bookkeeping: no IO, no clock)."""

    def __init__(self, pool: int, tenant_share: float) -> None:
        self.pool = pool
        self.share = max(1, math.ceil(pool * tenant_share))
        self.total = 0
        self.held: dict[str, int] = {}

    def take(self, tenant: str) -> bool:
        """Count one more request of ``tenant``; False (nothing counted) when it holds its
        share already and no more than a share of the pool is free."""
        holding = self.held.get(tenant, 0)
        if holding >= self.share and self.pool - self.total <= self.share:
            return False
        self.held[tenant] = holding + 1
        self.total += 1
        return True

    def give_back(self, tenant: str) -> None:
        holding = self.held[tenant] - 1
        if holding:
            self.held[tenant] = holding
        else:
            del self.held[tenant]  # the dict holds only tenants with requests in flight
        self.total -= 1


class UpstreamShareMiddleware:
    """Admits each ``/v1/`` request against its tenant's share of the upstream pool.
    Requests without a valid key pass on: their route answers 401."""

    def __init__(self, app: ASGIApp, *, shares: UpstreamShares, auth: Authenticator) -> None:
        self.app = app
        self.shares = shares
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(UPSTREAM_PREFIX):
            await self.app(scope, receive, send)
            return
        try:
            caller = self.auth.identify(Headers(scope=scope))
        except GatewayError:  # not a key (or keys unavailable): the route says so
            await self.app(scope, receive, send)
            return
        tenant = key_id(caller.tenant_name)  # forward mode: the key's own id, never the key
        if not self.shares.take(tenant):
            held = self.shares.held.get(tenant, 0)
            error = TooManyRequests(
                f"Too many requests in flight for this tenant: it holds "
                f"{held} of this gateway's {self.shares.pool} "
                "upstream connections while few are free (upstream.tenant_share). "
                "Please try again once one has finished.",
                kind="requests",
                retry_after_s=1,
                limit_headers={},
            )
            await refuse(error, scope, receive, send)  # spread, as every 429 of the gateway
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.shares.give_back(tenant)


def upstream_shares(pool: int, tenant_share: float) -> UpstreamShares | None:
    """The bookkeeping, or None when a tenant may take the whole pool (``tenant_share`` 1)."""
    return None if tenant_share >= 1 else UpstreamShares(pool, tenant_share)
