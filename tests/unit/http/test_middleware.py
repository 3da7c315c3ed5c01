"""The request middleware: route templates (never paths) and statuses counted, timed."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.http.middleware import MetricsMiddleware
from gateway.observability import metrics


def _app() -> Starlette:
    async def item(request: Request) -> PlainTextResponse:
        timer = metrics.timer(request.scope)
        timer.upstream_sent()
        timer.upstream_answered()
        return PlainTextResponse("ok")

    async def broken(request: Request) -> PlainTextResponse:
        raise RuntimeError("boom")

    return Starlette(
        routes=[
            Route("/items/{item_id}", item),
            Route("/broken", broken),
        ],
        middleware=[Middleware(MetricsMiddleware)],
    )


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_middleware_labels_route_templates_and_statuses() -> None:
    requests = "memory_gateway_requests_total"
    ok = {"route": "/items/{item_id}", "method": "GET", "status": "200"}
    failed = {"route": "/broken", "method": "GET", "status": "500"}
    missing = {"route": "unmatched", "method": "GET", "status": "404"}
    added = "memory_gateway_added_latency_seconds_count"
    before = [sample(requests, **ok), sample(requests, **failed), sample(requests, **missing)]
    added_before = sample(added, route="/items/{item_id}")
    with TestClient(_app(), raise_server_exceptions=False) as client:
        assert client.get("/items/secret-id-1").status_code == 200
        assert client.get("/items/secret-id-2").status_code == 200
        assert client.get("/broken").status_code == 500
        assert client.get("/nowhere/else").status_code == 404
    after = [sample(requests, **ok), sample(requests, **failed), sample(requests, **missing)]
    assert [b - a for a, b in zip(before, after, strict=True)] == [2, 1, 1]
    assert sample(added, route="/items/{item_id}") - added_before == 2
    assert b"secret-id" not in metrics.exposition()
