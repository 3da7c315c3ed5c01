"""``/admin/keys``: the gateway's keys (``auth.mode: keys``), for the holder of
``auth.admin_key``: create one (its secret is shown once), list them, revoke one.

A revoked key is refused by every process within ``auth.refresh_s`` (each re-reads the
keys when their version in Redis moves).

Wrong admin keys are limited per client address (``auth.admin_attempts`` per
``auth.admin_window_s``, then 429 with Retry-After), counted by each process in its own
memory: a guesser reaching N processes has N times the attempts, which changes nothing
that matters (the admin key is 16 characters or more; ``gateway.auth.attempts``), and the
limit holds while Redis is down. The right key is never locked out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth.attempts import Attempts, LocalFailures
from gateway.auth.authenticator import (
    KeyRecord,
    KeyRegistry,
    is_admin,
    key_id,
    new_key,
)
from gateway.auth.identity import has_control_characters
from gateway.config import AuthConfig
from gateway.errors import InvalidRequest, NotFound, Unauthorized
from gateway.http.server import client_address
from gateway.routes.memory_api import parse_body
from gateway.routes.relay import read_body
from gateway.store.gateway_keys import GatewayKeys

MAX_BODY_BYTES = 64 * 1024


def _printable(value: str) -> str:
    # Shown as they are in the key listing, the logs and the inspector.
    if has_control_characters(value):
        raise ValueError("must not contain control characters")
    return value


Printable = Annotated[StrictStr, AfterValidator(_printable)]


class _NewKey(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant: Printable = Field(min_length=1, max_length=128)
    users: list[Annotated[Printable, Field(min_length=1, max_length=128)]] | Literal["*"] = "*"
    upstream_key: StrictStr | None = None
    # Finite: an infinite quota was stored, then no listing could be answered (JSON has
    # no Infinity). None: auth.quota_mb; 0: no bound.
    quota_mb: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    name: Printable | None = Field(default=None, max_length=128)


class AdminAPI:
    def __init__(
        self,
        config: AuthConfig,
        keys: GatewayKeys,
        registry: KeyRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.keys = keys
        self.registry = registry
        self.clock = clock
        self.attempts = Attempts(
            LocalFailures(clock),
            limit=config.admin_attempts,
            window_s=config.admin_window_s,
            what="wrong admin keys",
        )

    def routes(self) -> list[Route]:
        return [
            Route("/admin/keys", self.create, methods=["POST"]),
            Route("/admin/keys", self.list, methods=["GET"]),
            Route("/admin/keys/{key_id}", self.revoke, methods=["DELETE"]),
        ]

    async def _admin(self, request: Request) -> None:
        if is_admin(request.headers, self.config.admin_key):
            return  # checked before any count: the right key is never locked out
        host = request.client.host if request.client else "unknown"
        await self.attempts.wrong_key(client_address(host))  # past the limit: 429
        raise Unauthorized("the admin API needs auth.admin_key", code="invalid_admin_key")

    async def create(self, request: Request) -> Response:
        await self._admin(request)
        body, _ = parse_body(_NewKey, await read_body(request, MAX_BODY_BYTES))
        if body.upstream_key is not None and body.upstream_key not in self.config.upstream_keys:
            raise InvalidRequest(
                "upstream_key must name a key in auth.upstream_keys", param="upstream_key"
            )
        secret = new_key()
        record = KeyRecord(
            key_id(secret),
            body.tenant,
            None if body.users == "*" else frozenset(body.users),
            body.upstream_key,
            body.quota_mb,
            body.name,
            self.clock(),
            stored=True,
        )
        await self.keys.save(record.id, record.to_data())
        # This process serves it at once; the others at their next refresh.
        found = await self.keys.changed_since(None)
        if found is not None:
            self.registry.replace(*found)
        return JSONResponse({**record.to_data(), "key": secret}, status_code=201)

    async def list(self, request: Request) -> Response:
        await self._admin(request)
        records = [
            {**r.to_data(), "source": "admin" if r.stored else "config"}
            for r in self.registry.records()
        ]
        return JSONResponse({"keys": records})

    async def revoke(self, request: Request) -> Response:
        await self._admin(request)
        found = request.path_params["key_id"]
        if not await self.keys.revoke(found):
            raise NotFound("no such key made through the admin API", param="key_id")
        changed = await self.keys.changed_since(None)
        if changed is not None:
            self.registry.replace(*changed)
        return Response(status_code=204)
