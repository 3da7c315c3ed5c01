"""The metrics helpers: operation names, tokens sent, the backlog's parsing, the middleware."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ResponseError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.memory.accounting import tokens_sent
from gateway.memory.counting import TOKENS_PER_MESSAGE, TOKENS_PER_REPLY
from gateway.memory.model import Message
from gateway.memory.reconcile import Reconciled
from gateway.observability import metrics
from gateway.routes.prometheus import JobBacklog, JobBacklogReader, backlog_from


class Store:
    def load(self) -> Any:
        def build(pipe: Any) -> None:
            pass

        return build

    def record(self) -> Any:
        return lambda: None


def test_an_operation_is_named_after_the_store_method_it_was_made_in() -> None:
    assert metrics._op_name(Store().load()) == "load"
    assert metrics._op_name(Store().record()) == "record"
    assert metrics._op_name(Store().load) == "load"  # a bound method: its own name
    assert metrics._op_name(_wrapped(Store().load())) == "load"


def _wrapped(build: Any) -> Any:
    """A private helper's closure, as ``RedisStore._pipeline`` makes around a builder."""

    def run() -> None:
        build(None)

    return run


def msg(role: str, text: str, tokens: int = 0) -> Message:
    return Message(role=role, content=text, tokens=tokens)


def test_tokens_sent_take_stored_counts_for_a_resent_history() -> None:
    stored = (msg("user", "first question", 11), msg("assistant", "first answer", 13))
    new = (msg("user", "second question", 7),)
    prompt = (msg("system", "be brief", 5),)
    plan = Reconciled(prompt=prompt, prior=stored, to_record=new, new=new)
    sent = [
        msg("system", "be brief"),
        msg("user", "first question"),
        msg("assistant", "first answer"),
        msg("user", "second question"),
    ]
    assert tokens_sent(sent, plan) == TOKENS_PER_REPLY + 5 + 11 + 13 + 7


def test_tokens_sent_estimate_what_goes_past_the_stored_tail() -> None:
    stored = (msg("assistant", "known answer", 13),)
    new = (msg("user", "next", 4),)
    plan = Reconciled(prompt=(), prior=stored, to_record=new, new=new)
    older = msg("user", "x" * 400)  # not in the loaded tail: ~4 characters a token
    sent = [older, msg("assistant", "known answer"), msg("user", "next")]
    expected = TOKENS_PER_REPLY + 4 + 13 + TOKENS_PER_MESSAGE + 100
    assert tokens_sent(sent, plan) == expected


def test_tokens_sent_do_not_borrow_counts_from_a_history_that_differs() -> None:
    stored = (msg("assistant", "what we stored", 50),)
    new = (msg("user", "next", 4),)
    plan = Reconciled(prompt=(), prior=stored, to_record=new, new=new)
    sent = [msg("assistant", "an edited answer"), msg("user", "next")]
    assert tokens_sent(sent, plan) == TOKENS_PER_REPLY + 4 + TOKENS_PER_MESSAGE + 4


def test_the_backlog_from_redis_replies() -> None:
    groups = [
        {"name": "other", "pending": 9, "lag": 9},
        {"name": b"summarizers", "pending": 2, "lag": 5},
    ]
    oldest = [(b"1000000-0", {b"job": b"j"})]
    assert backlog_from(groups, 7, oldest, (1004, 500_000)) == JobBacklog(5, 2, 4.5)


def test_the_backlog_without_lag_or_stream() -> None:
    # Redis < 7: no lag field; what the stream holds beyond the delivered is undelivered.
    groups = [{"name": "summarizers", "pending": 1, "lag": None}]
    assert backlog_from(groups, 4, [], (5, 0)) == JobBacklog(3, 1, 0.0)
    missing = ResponseError("no such key")
    assert backlog_from(missing, 0, [], (5, 0)) == JobBacklog(0, 0, 0.0)


class CountingStore:
    """A store whose round trip answers a fixed backlog (as Redis sends it) and counts
    its round trips."""

    def __init__(self) -> None:
        self.trips = 0
        self.job_shards = 2

    async def execute(self, commands: list[tuple[Any, ...]], **options: Any) -> list[Any]:
        self.trips += 1
        shard = [[{b"name": b"summarizers", b"pending": 0, b"lag": self.trips}], 0, []]
        other = [[[b"name", b"summarizers", b"pending", 1, b"lag", 10 * self.trips]], 0, []]
        assert len(commands) == 3 * self.job_shards + 1  # and the server's clock
        return [*shard, *other, [b"0", b"0"]]


async def test_the_backlog_is_read_at_most_once_per_cache_period() -> None:
    now = [100.0]
    store = CountingStore()
    reader = JobBacklogReader(store, clock=lambda: now[0])  # type: ignore[arg-type]
    first = await reader.read()
    now[0] += 1.0
    assert await reader.read() == first
    now[0] += 1.5
    second = await reader.read()
    assert store.trips == 2
    assert first is not None and second is not None
    assert (first[0].undelivered, second[0].undelivered) == (1, 2)
    assert (first[1].undelivered, first[1].delivered, second[1].undelivered) == (10, 1, 20)


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
        middleware=[Middleware(metrics.MetricsMiddleware)],
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


def test_requests_the_middleware_does_not_see_still_time_harmlessly() -> None:
    scope: dict[str, Any] = {"type": "http"}
    timer = metrics.timer(scope)
    timer.upstream_sent()  # no error, nothing observed: metrics are off
    assert "memory_gateway.timer" not in scope


@pytest.mark.parametrize("status", ["200", "500"])
def test_exposition_is_prometheus_text(status: str) -> None:
    metrics._child(metrics.REQUESTS, "/x", "GET", status).inc()
    text = metrics.exposition().decode()
    assert f'memory_gateway_requests_total{{method="GET",route="/x",status="{status}"}}' in text
