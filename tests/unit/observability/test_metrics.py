"""The metrics helpers: tokens sent, the backlog's cache, the timer."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.memory.accounting import tokens_sent
from gateway.memory.counting import TOKENS_PER_MESSAGE, TOKENS_PER_REPLY
from gateway.memory.model import Message
from gateway.memory.reconcile import Reconciled
from gateway.observability import metrics
from gateway.routes.prometheus import JobBacklogReader
from gateway.store.backlog import JobBacklog
from gateway.store.redis_store import StoreUnavailable


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


class CountingQueue:
    """A job queue whose backlog read answers a new backlog each time, and counts them."""

    def __init__(self) -> None:
        self.trips = 0

    async def backlog(self, *, timeout_s: float) -> dict[int, JobBacklog]:
        self.trips += 1
        return {0: JobBacklog(self.trips, 0, 0.0), 1: JobBacklog(10 * self.trips, 1, 0.0)}


async def test_the_backlog_is_read_at_most_once_per_cache_period() -> None:
    now = [100.0]
    queue = CountingQueue()
    reader = JobBacklogReader(queue, clock=lambda: now[0])
    first = await reader.read()
    now[0] += 1.0
    assert await reader.read() == first
    now[0] += 1.5
    second = await reader.read()
    assert queue.trips == 2
    assert first is not None and second is not None
    assert (first[0].undelivered, second[0].undelivered) == (1, 2)
    assert (first[1].undelivered, first[1].delivered, second[1].undelivered) == (10, 1, 20)


class FailingQueue:
    """A job queue whose backlog read raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def backlog(self, *, timeout_s: float) -> dict[int, JobBacklog]:
        raise self.error


async def test_a_backlog_redis_did_not_give_is_down_and_one_unreadable_is_logged_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert await JobBacklogReader(FailingQueue(StoreUnavailable("redis: timeout"))).read() is None
    assert "backlog could not be read" not in caplog.text  # Redis's state, not a bug
    assert await JobBacklogReader(FailingQueue(ValueError("bad reply"))).read() is None
    assert "the job backlog could not be read" in caplog.text and "bad reply" in caplog.text


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


def _totals() -> tuple[float, ...]:
    names = ("upstream_prompt_tokens", "upstream_cached_tokens", "context_stable_tokens")
    values = (metrics.REGISTRY.get_sample_value(f"memory_gateway_{n}_total") for n in names)
    return tuple(v or 0.0 for v in values)


def test_the_upstreams_counts_and_the_prediction_add_up_only_where_known() -> None:
    start = _totals()
    metrics.upstream_usage(2000, 1536)
    metrics.upstream_usage(900, None)  # an upstream that says nothing of its cache
    metrics.upstream_usage(None, None)  # nor of its prompt
    metrics.tokens(50, 2100, 1600)
    metrics.tokens(50, 2100, None)  # no prediction: no previous context
    moved = tuple(after - before for after, before in zip(_totals(), start, strict=True))
    assert moved == (2900, 1536, 1600)
