"""``GET /healthz``: is the gateway up, and can it reach its memory."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.store.redis_store import RedisStore, StoreUnavailable


class Health:
    def __init__(self, store: RedisStore) -> None:
        self.store = store

    async def handle(self, request: Request) -> JSONResponse:
        try:
            await self.store.ping()
        except StoreUnavailable:
            # Still 200: the gateway serves (fail-open); the body says memory is degraded.
            return JSONResponse({"status": "degraded", "redis": "unavailable"})
        return JSONResponse({"status": "ok", "redis": "ok"})
