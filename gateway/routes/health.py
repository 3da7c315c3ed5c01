"""``GET /healthz`` (liveness) and ``GET /readyz`` (readiness).

``/healthz`` answers 200 while the process serves: the gateway fails open without Redis,
so an orchestrator must not restart it for that; the body still says how memory is.
``/readyz`` answers 503 when Redis does not answer within a short deadline: a load
balancer then sends the requests to a replica that has its memory.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.errors import error_body
from gateway.service.ports import ServerStore
from gateway.store.redis_store import StoreUnavailable

# Short: a probe runs every few seconds, and a Redis slower than this is not ready for
# the request path's own deadline either.
READY_TIMEOUT_S = 0.5


class Health:
    def __init__(self, store: ServerStore) -> None:
        self.store = store

    async def handle(self, request: Request) -> JSONResponse:
        try:
            await self.store.ping()
        except StoreUnavailable:
            # Still 200: the gateway serves (fail-open); the body says memory is degraded.
            return JSONResponse({"status": "degraded", "redis": "unavailable"})
        return JSONResponse({"status": "ok", "redis": "ok"})

    async def ready(self, request: Request) -> JSONResponse:
        try:
            await self.store.ping(timeout_s=READY_TIMEOUT_S)
        except StoreUnavailable as error:
            body = error_body(
                f"not ready: redis did not answer within {READY_TIMEOUT_S} s ({error})",
                "memory_unavailable",
                code="redis_unavailable",
            )
            return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        return JSONResponse({"status": "ready", "redis": "ok"})
