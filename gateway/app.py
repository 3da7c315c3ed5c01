"""``create_app``: wiring only. Clients are created by the caller and injected."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp

from gateway.auth.authenticator import Authenticator, KeyRegistry
from gateway.auth.authenticator import watch as watch_keys
from gateway.auth.tenancy import Tenants, keep_secret
from gateway.compat.starlette import OutermostStarlette
from gateway.config import Settings
from gateway.dialects.anthropic.dialect import AnthropicDialect
from gateway.dialects.chat.request import check_turn_tool_results
from gateway.dialects.responses.dialect import RESPONSES
from gateway.errors import GatewayError, MemoryUnavailable, error_body
from gateway.http.anthropic_edge import AnthropicEdge
from gateway.http.cors import cors_middleware
from gateway.http.middleware import MetricsMiddleware
from gateway.http.rate_limits import RateLimitMiddleware, rate_limiter
from gateway.http.upstream_share import UpstreamShareMiddleware, upstream_shares
from gateway.memory.archive import ArchiveCache
from gateway.routes.admin import AdminAPI
from gateway.routes.health import Health
from gateway.routes.memory_api import MemoryAPI
from gateway.routes.memory_proxy import MemoryProxy
from gateway.routes.openapi import OpenAPIEndpoint
from gateway.routes.over_chat import ResponsesUpstream
from gateway.routes.passthrough import Passthrough
from gateway.routes.prometheus import MetricsEndpoint
from gateway.routes.relay import CLIENT_CLOSED
from gateway.service.activity import Activity
from gateway.service.memory_service import MemoryService
from gateway.service.operations import SessionOperations
from gateway.service.ports import Embedder
from gateway.service.turn_service import TurnService
from gateway.service.worker import JobRunner, Worker
from gateway.store.durability import warn_if_not_durable
from gateway.store.gateway_keys import GatewayKeys
from gateway.store.keys import SessionKeys
from gateway.store.redis_store import RedisStore, StoreUnavailable
from gateway.text.embedder import StaticEmbedder
from gateway.text.tokens import TokenCounter
from gateway.ui.inspector import Inspector
from gateway.ui.tenant_labels import TenantLabels
from gateway.upstream.client import Upstream
from gateway.upstream.headers import Allowlist

log = logging.getLogger(__name__)

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.response_headers())


async def _store_unavailable(request: Request, exc: Exception) -> Response:
    # The memory API cannot fail open: without Redis there is nothing to show or change.
    error = MemoryUnavailable("memory store unavailable; try again shortly")
    return JSONResponse(error.body(), status_code=error.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
    headers = exc.headers
    if exc.status_code == 405:
        headers = {**_without_allow(headers), "allow": _allowed_methods(request)}
    return JSONResponse(
        error_body(str(exc.detail), kind, code=str(exc.status_code)),
        status_code=exc.status_code,
        headers=headers,
    )


def _without_allow(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {name: value for name, value in (headers or {}).items() if name.lower() != "allow"}


def _allowed_methods(request: Request) -> str:
    """Every method a 405's path takes. Starlette's Allow names only the first route of
    the path, and one path may have a route per method (the memory API's)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.methods:
            match, _ = route.matches(request.scope)
            if match is not Match.NONE:
                methods |= route.methods
    return ", ".join(sorted(methods))


async def _client_left(request: Request, exc: Exception) -> Response:
    # The client left before its body was whole, or was cut off at the body's deadline
    # (http/server.py answered it 408): no one to answer, and nothing unexpected.
    return Response(status_code=CLIENT_CLOSED)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return JSONResponse(error_body("internal gateway error", "server_error"), status_code=500)


class _Gateway(OutermostStarlette):
    """Starlette with the request middleware (id, metrics, access line) outermost: outside
    Starlette's own error middleware too, so that the 500 of an unexpected error carries
    the request id and is counted and logged as a 500."""

    def __init__(self, *, metrics: bool, access_log: bool, **options: Any) -> None:
        super().__init__(**options)
        # No redirect from "/x/" to "/x": Starlette's is absolute, built from the request's
        # own Host header (a redirect to any host a client names, answered before any
        # authentication), and a path the gateway does not serve is a 404.
        self.router.redirect_slashes = False
        self._request_options = {"metrics": metrics, "access_log": access_log}

    def outermost(self, app: ASGIApp) -> ASGIApp:
        # Anthropic's key header and error envelope on its paths, whichever layer answers.
        return MetricsMiddleware(AnthropicEdge(app), **self._request_options)


def _lifespan(
    settings: Settings,
    *,
    store: RedisStore,
    job_store: RedisStore,
    tokenizer: TokenCounter,
    tenants: Tenants,
    registry: KeyRegistry,
    gateway_keys: GatewayKeys,
    runner: JobRunner,
    turns: Sequence[TurnService],
    activity: Activity,
    resources: AbstractAsyncContextManager[object] | None,
    mcp: AbstractAsyncContextManager[None] | None = None,
) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """What runs beside the server: the caller's ``resources``, the warm-up, the MCP
    transport's tasks (``mcp``), and the background tasks (the durability check, the keys'
    watch, the in-process worker); at the end, the proxies' recordings still running are
    waited for, before the store closes."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if resources is not None:
                await stack.enter_async_context(resources)
            if mcp is not None:
                await stack.enter_async_context(mcp)
            # What the first requests would otherwise pay for, inside their deadlines: the
            # token encoding (~0.4 s to load), the scripts in Redis, its connections.
            tokenizer.warm()
            try:
                await tenants.load(timeout_s=2.0)
                await store.warm(timeout_s=2.0)
            except StoreUnavailable as error:
                # Serve anyway (fail-open); the secret is fetched again on the next request.
                log.warning("redis not reachable at start-up: %s", error)
            # An external Redis may evict or forget memory (the embedded one is ours:
            # AOF, noeviction). In the background: start-up never waits on Redis.
            durability_check = None
            if settings.redis.url != "embedded":
                durability_check = asyncio.create_task(
                    warn_if_not_durable(store.server, secret_in_redis=not tenants.configured)
                )
            stop = asyncio.Event()
            # Keys made or revoked through the admin API, read by every process.
            keys_task = None
            if settings.auth.mode == "keys":
                keys_task = asyncio.create_task(
                    watch_keys(registry, gateway_keys.changed_since, stop)
                )
            # The tenant secret kept in Redis, written back should Redis lose it.
            secret_task = None
            if not tenants.configured:
                secret_task = asyncio.create_task(
                    keep_secret(tenants, job_store.server, settings.auth.refresh_s, stop)
                )
            worker_task = None
            if settings.worker.in_process:
                worker = Worker.from_config(job_store, runner, settings.worker, activity)
                worker_task = asyncio.create_task(worker.run(stop))
            try:
                yield
            finally:
                stop.set()
                for service in turns:  # a turn whose client left may still be recording
                    await service.settle()
                if durability_check is not None:
                    durability_check.cancel()
                    await asyncio.gather(durability_check, return_exceptions=True)
                if worker_task is not None:
                    await worker_task
                if keys_task is not None:
                    await keys_task
                if secret_task is not None:
                    await secret_task

    return lifespan


def _interval_clock(clock: Callable[[], float]) -> Callable[[], float]:
    """The clock of intervals (caches, verdicts' lifetimes): ``time.monotonic`` beside
    the real wall clock, which may jump; a test's clock stands for both."""
    return time.monotonic if clock is time.time else clock


def create_app(
    settings: Settings,
    *,
    upstream: Upstream,
    store: RedisStore,
    tokenizer: TokenCounter,
    runner: JobRunner,
    anthropic: Upstream | None = None,
    embedder: Embedder | None = None,
    vectors: StaticEmbedder | None = None,
    resources: AbstractAsyncContextManager[object] | None = None,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The ASGI app.

    ``runner`` runs summarization jobs (flush, end of session, and the in-process worker
    when ``worker.in_process``). ``resources`` is entered before start-up and left after
    shutdown: the caller's processes and clients (the embedded Redis, say) live exactly
    as long as the server does, whichever way the server is stopped. ``vectors`` gives
    recall the meaning of words (``embedder.StaticEmbedder``); without it recall matches
    words only. ``anthropic``: the Messages API's upstream (None: no ``/v1/messages``).
    ``clock`` is the time every part of the app reads (a test's own steps it).
    """
    intervals = _interval_clock(clock)
    tenants = Tenants(store.server, settings.server.tenant_secret)
    registry = KeyRegistry(settings.auth, clock)
    auth = Authenticator(
        settings.auth,
        tenants=tenants,
        registry=registry,
        upstream_api_key=settings.upstream.api_key,
        check_upstream=upstream.accepts_key,
        clock=intervals,
    )
    passthrough = Passthrough(
        upstream,
        auth,
        settings.upstream.passthrough_paths(settings.auth.mode == "keys"),
        Allowlist.extended(settings.upstream.forward_headers),
    )
    # One set of session archives in memory for the proxy and the memory API.
    archives: ArchiveCache[SessionKeys] = ArchiveCache(settings.memory.archive_cache_mb * 2**20)

    def memory_on(deadline_store: RedisStore) -> MemoryService:
        return MemoryService(
            deadline_store,
            tokenizer,
            settings.memory,
            embedder,
            vectors=vectors,
            archives=archives,
            models=settings.models,
            max_request_bytes=settings.upstream.max_request_bytes,
            prompt_cache=settings.upstream.prompt_cache,
            clock=clock,
        )

    memory = memory_on(store)

    opened: list[TurnService] = []
    # The turns being worked on, which the in-process worker's jobs give way to.
    activity = Activity()

    def turns() -> TurnService:  # one per API: its own retry ceilings and recordings
        opened.append(TurnService(memory, auth, settings, check_turn_tool_results, activity))
        return opened[-1]

    chat = MemoryProxy(
        settings, upstream=upstream, turns=turns(), auth=auth, passthrough=passthrough
    )
    # The memory API is an operator's tool, not the request path: the same store, under
    # the jobs' deadline (seconds, not the proxy's 100 ms), as the worker and the keys.
    job_store = store.with_deadline(settings.worker.redis_timeout_s)
    api_memory = memory_on(job_store)
    operations = SessionOperations(api_memory, runner, clock)
    memory_api = MemoryAPI(
        operations, auth, max_body_bytes=settings.server.max_body_bytes, limits=settings.server
    )
    gateway_keys = job_store.gateway_keys
    mcp = None
    if settings.server.mcp:
        # Imported only when served: the MCP SDK takes ~0.5 s to import, which every
        # operator command (they build no app) would otherwise pay.
        from gateway.routes.mcp_server import McpServer

        mcp = McpServer(
            memory_api,
            max_body_bytes=settings.server.max_body_bytes,
            allow_origins=settings.server.cors.allow_origins,
        )

    lifespan = _lifespan(
        settings,
        store=store,
        job_store=job_store,
        tokenizer=tokenizer,
        tenants=tenants,
        registry=registry,
        gateway_keys=gateway_keys,
        runner=runner,
        turns=opened,  # (the Responses and Messages APIs' are added below: read at shutdown)
        activity=activity,
        resources=resources,
        mcp=mcp.running() if mcp is not None else None,
    )
    health = Health(store.server)
    routes = [Route("/v1/chat/completions", chat.handle, methods=["POST"])]
    if passthrough.allows("/v1/responses"):
        # The same pipeline for the Responses API (its own retry ceilings and recordings).
        # Only where the allowlist takes the path: with gateway keys (one upstream account
        # for every tenant) it does not by default, as responses live in that account.
        responses = MemoryProxy(
            settings,
            upstream=upstream,
            turns=turns(),
            auth=auth,
            passthrough=passthrough,
            dialect=RESPONSES,
            responses=ResponsesUpstream(upstream, settings.upstream.responses),
        )
        routes.append(Route("/v1/responses", responses.handle, methods=["POST"]))
    if anthropic is not None:
        # Anthropic's Messages API: the same pipeline, to its own upstream (its
        # count_tokens and batches passed there as they are).
        # With gateway keys, one operator account is every tenant's: its batches too
        # (listed and read by anyone), so only the stateless count_tokens goes through.
        stateless = settings.auth.mode == "keys"
        paths = ["messages", "messages/count_tokens" if stateless else "messages/**"]
        messages_passthrough = Passthrough(anthropic, auth, paths, passthrough.allowlist)
        messages = MemoryProxy(
            settings,
            upstream=anthropic,
            turns=turns(),
            auth=auth,
            passthrough=messages_passthrough,
            dialect=AnthropicDialect(marks=settings.memory.composition.stable is not None),
        )
        routes += [
            Route("/v1/messages", messages.handle, methods=["POST"]),
            Route("/v1/messages/{path:path}", messages_passthrough.handle, methods=ALL_METHODS),
        ]
    routes += [
        Route("/v1/{path:path}", passthrough.handle, methods=ALL_METHODS),
        Route("/healthz", health.handle, methods=["GET"]),
        Route("/readyz", health.ready, methods=["GET"]),
        Route("/openapi.json", OpenAPIEndpoint().handle, methods=["GET"]),
        *memory_api.routes(),
        *(mcp.routes() if mcp is not None else []),
    ]
    if settings.server.metrics:
        # The backlog is read under its own short deadline (``prometheus.DEADLINE_S``).
        # The backlog read is background traffic: on the jobs' connections, not a request's.
        scrape = MetricsEndpoint(job_store.queue, settings.server.metrics_token, clock=intervals)
        routes.append(Route("/metrics", scrape.handle, methods=["GET"]))
    if settings.auth.admin_key is not None:
        routes += AdminAPI(settings.auth, gateway_keys, registry, clock).routes()
    if settings.ui.enabled:
        # Tenants by name where the gateway knows one (its keys' tenants), never a secret.
        named = registry if settings.auth.mode == "keys" else None
        labels = TenantLabels(tenants, named)
        routes += Inspector(operations, settings.ui, clock, labels).routes()
    # Rate limits (``limits``): not installed at all when none is configured.
    limiter = rate_limiter(settings, store.limits, clock)
    middleware = []
    if settings.server.cors.allow_origins:
        # Outside the rate limits: a browser's preflight is answered here, never counted
        # or sent upstream.
        middleware.append(cors_middleware(settings.server.cors))
    if limiter is not None:
        middleware.append(Middleware(RateLimitMiddleware, limiter=limiter, auth=auth))
    # Inside the rate limits: a request they refuse holds no share of the pool.
    shares = upstream_shares(settings.upstream.max_connections, settings.upstream.tenant_share)
    if shares is not None:
        middleware.append(Middleware(UpstreamShareMiddleware, shares=shares, auth=auth))
    return _Gateway(
        metrics=settings.server.metrics,
        access_log=settings.server.access_log,
        routes=routes,
        middleware=middleware,
        exception_handlers={
            GatewayError: _gateway_error,
            StoreUnavailable: _store_unavailable,
            HTTPException: _http_error,
            ClientDisconnect: _client_left,
            Exception: _unexpected,
        },
        lifespan=lifespan,
    )
