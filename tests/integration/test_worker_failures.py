"""A worker that cannot fall behind silently, on a real Redis: whatever the summarizer does
(fails, refuses, times out, answers unusable text) and whatever a job does (raises, never
returns), a session's pending jobs stay bounded. A job that fails runs again after a
backoff, before its session's later jobs, and its last attempt drops it (counted, one
warning without content); what is pending keeps its notice in the stream, where
``/metrics`` reads the backlog.

The summarizer's model is a real HTTP server (``local_upstream``); the failures of a
job itself come from a summary writer of the test's own around the model-free one.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
from aiohttp import web

from devsupport.servers import RedisProcess
from gateway.memory.model import Message, Tiers
from gateway.observability.metrics import REGISTRY
from gateway.presets import PRESETS
from gateway.service.activity import QUIET_S, Activity
from gateway.service.worker import JobRunner, Worker
from gateway.store.keys import SessionKeys, job_stream
from gateway.store.redis_store import JobNotice, RedisStore, create_client
from gateway.summarize.run import SummaryWriter
from gateway.summarize.summarizer import Summarizer, Written
from gateway.text.tokens import TokenCounter
from gateway.upstream.models import UpstreamChatModel
from tests.support.local_upstream import local_upstream
from tests.support.recorded_turns import Turns, turn_of
from tests.support.waiting import until

ROLLING = PRESETS["rolling-summary"]  # one job every turn: a fold, or a compression
STREAM = job_stream(0)  # one shard: every notice of the test is there
BACKOFF_S = 0.01


@pytest.fixture
async def store(private_redis: RedisProcess, admin: Any) -> AsyncIterator[RedisStore]:
    client = create_client(private_redis.url, timeout_s=2, max_connections=16)
    opened = RedisStore(client, timeout_s=2, retention_s=3600, job_shards=1)
    yield opened
    await opened.close()


def runner(
    store: RedisStore, writer: SummaryWriter, *, lease_ms: int = 5_000, **kw: Any
) -> JobRunner:
    options: dict[str, Any] = {"attempts": 3, "backoff_s": BACKOFF_S, "backoff_most_s": 1.0}
    return JobRunner(store, writer, ROLLING, lease_ms=lease_ms, **(options | kw))


@asynccontextmanager
async def working(jobs: JobRunner) -> AsyncIterator[Worker]:
    worker = Worker(jobs.store.queue, jobs, concurrency=4, block_ms=50, reclaim_idle_ms=10_000)
    stop = asyncio.Event()
    running = asyncio.ensure_future(worker.run(stop))
    try:
        yield worker
    finally:
        stop.set()
        await running


async def drained(admin: Any, within_s: float = 10.0) -> None:
    """Every notice acknowledged: the worker has nothing left to do, or to retry."""
    await until(lambda: admin.xlen(STREAM) == 0, within_s, "every notice acknowledged")


def counted(name: str, reason: str) -> float:
    return REGISTRY.get_sample_value(f"memory_gateway_{name}_total", {"reason": reason}) or 0.0


def tiers_of(admin: Any, keys: SessionKeys) -> Tiers:
    return Tiers.from_json(admin.get(keys.tiers))


async def with_jobs(store: RedisStore, name: str, turns: int) -> Turns:
    """A session of ``turns`` recorded turns, their jobs pending (a notice each)."""
    session = Turns(store, ROLLING, SessionKeys("t", name))
    for _ in range(turns):
        await session.add()
    return session


# --- the summarizer's model, over HTTP -----------------------------------------------------


async def _never(request: web.Request) -> web.StreamResponse:
    await asyncio.Event().wait()  # cancelled when the client gives up
    raise AssertionError("unreachable")


def _answer(content: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response({"choices": [{"message": {"content": content}}]})

    return answer


def _status(status: int) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "no"}}, status=status)

    return answer


async def _nested_body(request: web.Request) -> web.StreamResponse:
    return web.Response(body=b"[" * 100_000, content_type="application/json")


MODELS = {
    "fails (500)": _status(500),
    "refuses (400)": _status(400),
    "times out": _never,
    # A small model looping on a JSON prompt's first token: json.loads raised
    # RecursionError, the job failed for good and blocked its session's later ones.
    "answers unusable text": _answer("[" * 5000),
    "sends a body nested too deep": _nested_body,
}


# --- jobs that fail themselves ---------------------------------------------------------------


class Failing:
    """The model-free summarizer, but its folds and compressions of ``turns`` (all: None)
    fail ``times`` times each (None: always) by raising, or by never returning (``hang``).
    Every such call is noted: (turn, loop time)."""

    def __init__(self, turns: set[int] | None = None, *, times: int | None = None,
                 hang: bool = False) -> None:  # fmt: skip
        self.inner = Summarizer(None, TokenCounter())
        self.turns, self.times, self.hang = turns, times, hang
        self.calls: list[tuple[int, float]] = []
        self.failed: dict[int, int] = {}

    async def _maybe_fail(self, question: str) -> None:
        turn = turn_of(question)
        self.calls.append((turn, asyncio.get_running_loop().time()))
        if self.turns is not None and turn not in self.turns:
            return
        if self.times is not None and self.failed.get(turn, 0) >= self.times:
            return
        self.failed[turn] = self.failed.get(turn, 0) + 1
        if self.hang:
            await asyncio.Event().wait()
        raise RuntimeError("a bug in a summary job")

    async def fold(self, summary: str | None, question: str, answer: str, **kw: Any) -> Written:
        await self._maybe_fail(question)
        return await self.inner.fold(summary, question, answer, **kw)

    async def compress(
        self, summary: str | None, messages: Sequence[Message], **kw: Any
    ) -> Written:
        await self._maybe_fail(next(m.text for m in reversed(messages) if m.role == "user"))
        return await self.inner.compress(summary, messages, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextmanager
def warnings_of_the_worker(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    lines: list[str] = []
    with caplog.at_level(logging.INFO, logger="gateway.service.worker"):
        yield lines
    lines += [
        r.getMessage() for r in caplog.records
        if r.name == "gateway.service.worker" and r.levelno >= logging.WARNING
    ]  # fmt: skip


# --- (a) pending jobs stay bounded -----------------------------------------------------------


async def _turns_bounded(store: RedisStore, admin: Any, jobs: JobRunner, turns: int) -> list[int]:
    """Record ``turns`` turns, each left to the worker until it has nothing to do: the
    session's pending jobs after each."""
    session = Turns(store, ROLLING, SessionKeys("t", "bounded"))
    pending = []
    async with working(jobs):
        for _ in range(turns):
            await session.add()
            await drained(admin)
            pending.append(admin.hlen(session.keys.jobs))
    assert admin.zcard(session.keys.job_order) == pending[-1]
    return pending


@pytest.mark.parametrize("model", sorted(MODELS))
async def test_with_a_summarizer_model_that_fails_every_turn_is_summarized(
    store: RedisStore, admin: Any, model: str
) -> None:
    dropped = counted("jobs_dropped", "error") + counted("jobs_dropped", "timeout")
    async with local_upstream(MODELS[model]) as upstream:
        chat = UpstreamChatModel(
            base_url=upstream.base_url, api_key=None, model="m", timeout_s=0.05, temperature=0
        )
        try:
            pending = await _turns_bounded(
                store, admin, runner(store, Summarizer(chat, TokenCounter())), 60
            )
        finally:
            await chat.aclose()
    assert max(pending) == 0  # was 1, 2, … 60 for the last two: one more every turn
    tiers = tiers_of(admin, SessionKeys("t", "bounded"))
    assert tiers.rolling is not None and tiers.rolling.turn == 60 and tiers.rolling.fallback
    assert counted("jobs_dropped", "error") + counted("jobs_dropped", "timeout") == dropped


@pytest.mark.parametrize(("failure", "turns"), [("raises", 60), ("never returns", 12)])
async def test_jobs_that_always_fail_are_each_dropped_and_the_session_goes_on(
    store: RedisStore, admin: Any, caplog: pytest.LogCaptureFixture, failure: str, turns: int
) -> None:
    hang = failure == "never returns"
    reason = "timeout" if hang else "error"
    writer = Failing(hang=hang)
    # A job that never returns ends at its deadline (0.9 of the lease).
    jobs = runner(store, writer, lease_ms=150 if hang else 5_000)
    before = counted("jobs_dropped", reason), counted("jobs_failed", reason)
    with warnings_of_the_worker(caplog) as warnings:
        pending = await _turns_bounded(store, admin, jobs, turns)
    assert max(pending) == 0  # "raises" was 1, 2, … 60: every later job stuck behind the first
    # Each job: three attempts, then dropped, with one warning that names it, no content.
    assert counted("jobs_dropped", reason) - before[0] == turns
    assert counted("jobs_failed", reason) - before[1] == 3 * turns
    assert sorted(turn for turn, _ in writer.calls) == sorted(list(range(1, turns + 1)) * 3)
    dropped = [line for line in warnings if "dropped" in line]
    assert len(dropped) == turns == len(warnings)
    assert all("after 3 failed attempts" in line and "Porto" not in line for line in dropped)


async def test_a_job_that_failed_runs_again_after_its_backoff_before_the_later_jobs(
    store: RedisStore, admin: Any
) -> None:
    writer = Failing({1}, times=2)
    session = await with_jobs(store, "retried", 3)  # three notices, read together
    failed, dropped = counted("jobs_failed", "error"), counted("jobs_dropped", "error")
    async with working(runner(store, writer, backoff_s=0.05)):
        await drained(admin)
    assert [turn for turn, _ in writer.calls] == [1, 1, 1, 2, 3]  # in order, turn 1 not lost
    times = [at for _, at in writer.calls[:3]]
    assert times[1] - times[0] >= 0.05 and times[2] - times[1] >= 0.1  # the backoff doubles
    tiers = tiers_of(admin, session.keys)
    assert tiers.rolling is not None and tiers.rolling.turn == 3
    assert [pair.turn for pair in tiers.key_qa] == [1, 2, 3]
    assert counted("jobs_failed", "error") - failed == 2
    assert counted("jobs_dropped", "error") == dropped
    assert admin.hlen(session.keys.jobs) == 0 == admin.zcard(session.keys.job_order)


async def test_a_job_waiting_for_its_retry_is_in_the_backlog_metrics_read(
    store: RedisStore, admin: Any
) -> None:
    session = Turns(store, ROLLING, SessionKeys("t", "waiting"))
    await session.add()
    writer = Failing()
    async with working(runner(store, writer, backoff_s=30.0, backoff_most_s=30.0)):
        await until(lambda: writer.calls, 5, "the job's first attempt")
        await until(lambda: b"attempts" in (admin.hget(session.keys.jobs, "fold:1-2:t1") or b""),
                    5, "its failure counted")  # fmt: skip
        backlog = await store.queue.backlog(timeout_s=2)
    # Pending, and said so: the notice is read but not acknowledged while the job waits
    # (it was acknowledged at once, and the backlog said 0 whatever piled up).
    assert admin.hlen(session.keys.jobs) == 1
    assert backlog[0].delivered == 1 and backlog[0].undelivered == 0
    assert backlog[0].oldest_age_s >= 0
    assert len(writer.calls) == 1  # not run again before its backoff


async def test_jobs_kept_without_an_order_by_an_older_gateway_still_run_oldest_first(
    store: RedisStore, admin: Any
) -> None:
    session = await with_jobs(store, "older", 3)
    admin.delete(session.keys.job_order)  # as an older gateway left them: the hash alone
    newest = session.jobs[-1]
    entry = next(e for e, fields in admin.xrange(STREAM) if fields[b"job"] == newest.id.encode())
    writer = Failing(set())
    notice = JobNotice(entry, session.keys, newest.id)
    assert await runner(store, writer).run_notice(notice) == "written"
    assert [turn for turn, _ in writer.calls] == [1, 2, 3]  # the older ones first
    assert admin.hlen(session.keys.jobs) == 0 == admin.zcard(session.keys.job_order)


# --- (c) the in-process worker gives way to turns ----------------------------------------------


async def test_jobs_wait_while_turns_are_worked_on_then_each_starts_after_a_quiet_stretch(
    store: RedisStore, admin: Any
) -> None:
    """As in ``serve``: the worker's pace is the app's ``Activity``. A notice read while a
    turn is being prepared or recorded runs no job until the turn is over."""
    session = await with_jobs(store, "yields", 2)
    activity = Activity()
    paced: list[float] = []

    async def pace() -> object:
        paced.append(asyncio.get_running_loop().time())
        return await activity.quiet(30.0)

    writer = Failing(set())
    jobs = runner(store, writer)
    worker = Worker(store.queue, jobs, concurrency=4, block_ms=50, requests_first=pace)
    stop = asyncio.Event()
    running = asyncio.ensure_future(worker.run(stop))
    try:
        with activity.working():
            await until(lambda: paced, 5, "a notice read and its first job waiting")
            await asyncio.sleep(0.1)  # the turn goes on: no job meanwhile
            assert writer.calls == []
        ended = asyncio.get_running_loop().time()
        await drained(admin)
    finally:
        stop.set()
        await running
    assert [turn for turn, _ in writer.calls] == [1, 2]  # in order, once each
    first, second = (at for _, at in writer.calls)
    assert first - ended >= QUIET_S * 0.99 and second - first >= QUIET_S * 0.99
    assert admin.hlen(session.keys.jobs) == 0


async def test_under_unbroken_turns_the_jobs_still_run_one_per_longest_wait(
    store: RedisStore, admin: Any
) -> None:
    await with_jobs(store, "busy", 3)
    activity = Activity()
    writer = Failing(set())
    worker = Worker(
        store.queue, runner(store, writer), concurrency=4, block_ms=50,
        requests_first=functools.partial(activity.quiet, 0.05),
    )  # fmt: skip
    stop = asyncio.Event()
    with activity.working():  # never quiet
        running = asyncio.ensure_future(worker.run(stop))
        try:
            await drained(admin)
        finally:
            stop.set()
            await running
    assert [turn for turn, _ in writer.calls] == [1, 2, 3]
    times = [at for _, at in writer.calls]
    assert min(later - earlier for earlier, later in itertools.pairwise(times)) >= 0.05 * 0.9
