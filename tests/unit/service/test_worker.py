"""The job runner's own bookkeeping, without Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.memory.jobs import Job
from gateway.presets import PRESETS
from gateway.service.worker import JobRunner, Later, Outcome, Worker
from gateway.store.keys import SessionKeys
from gateway.store.redis_store import JobNotice, StoreUnavailable
from gateway.summarize.summarizer import Summarizer
from gateway.text.tokens import TokenCounter
from tests.support.waiting import until


class Leases:
    """A store that only releases leases, each after a pause (as a round trip does)."""

    def __init__(self, fail: bool = False) -> None:
        self.released: list[tuple[SessionKeys, str]] = []
        self.fail = fail

    @property
    def queue(self) -> Leases:  # the store's part the runner's leases are in
        return self

    async def release_lease(self, keys: SessionKeys, holder: str) -> None:
        await asyncio.sleep(0.01)
        if self.fail:
            raise StoreUnavailable("redis: down")
        self.released.append((keys, holder))


def runner(store: Any) -> JobRunner:
    return JobRunner(store, Summarizer(None, TokenCounter()), PRESETS["hybrid"], lease_ms=1000)


async def test_leases_left_by_a_redis_outage_are_released_once_by_concurrent_jobs() -> None:
    store = Leases()
    jobs = runner(store)
    left = {SessionKeys("t", f"s{i}"): f"holder{i}" for i in range(5)}
    jobs._unreleased.update(left)
    await asyncio.gather(*(jobs._release_leftovers() for _ in range(4)))
    assert sorted(store.released, key=str) == sorted(left.items(), key=str)
    assert jobs._unreleased == {}


async def test_a_lease_that_cannot_be_released_yet_is_kept_for_later() -> None:
    jobs = runner(Leases(fail=True))
    keys = SessionKeys("t", "s")
    jobs._unreleased[keys] = "holder"
    with pytest.raises(StoreUnavailable):
        await jobs._release_leftovers()
    assert jobs._unreleased == {keys: "holder"}


class LostReply(Leases):
    """A store whose lease writes land but whose replies are lost (Redis killed after
    the write, back with its AOF)."""

    def __init__(self) -> None:
        super().__init__()
        self.leases: dict[SessionKeys, str] = {}

    async def take_lease(self, keys: SessionKeys, holder: str, ttl_ms: int) -> bool:
        self.leases.setdefault(keys, holder)
        raise StoreUnavailable("redis: Connection closed by server.")


async def test_a_lease_whose_reply_was_lost_is_released_by_the_next_run() -> None:
    store = LostReply()
    jobs = runner(store)
    keys = SessionKeys("t", "s")
    with pytest.raises(StoreUnavailable):
        await jobs.run(keys, Job("chunk", 1, 15, 0))
    assert jobs._unreleased == {keys: store.leases[keys]}
    await jobs._release_leftovers()  # as the runner's next job does first
    assert store.released == [(keys, store.leases[keys])] and jobs._unreleased == {}


class Stuck:
    """A job stream whose reads never return (a node gone mid-call). Acks are counted."""

    job_shards = 3

    def __init__(self) -> None:
        self.acked: list[JobNotice] = []
        self.reading: set[int] = set()  # the shards with a read under way
        self.all_reading = asyncio.Event()

    async def ensure_group(self, shard: int) -> None:
        return None

    async def reclaim_jobs(self, shard: int, consumer: str, **_: Any) -> list[JobNotice]:
        return []

    async def read_jobs(self, shard: int, consumer: str, **_: Any) -> list[JobNotice]:
        self.reading.add(shard)
        if len(self.reading) == self.job_shards:
            self.all_reading.set()
        await asyncio.Event().wait()
        return []

    async def ack_job(self, notice: JobNotice) -> None:
        self.acked.append(notice)


async def test_a_stopping_worker_does_not_wait_for_a_read_that_never_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("gateway.service.worker.STOP_GRACE_S", 0.1)
    store = Stuck()
    worker = Worker(store, runner(Stuck()), block_ms=100)
    stop = asyncio.Event()
    running = asyncio.ensure_future(worker.run(stop))
    await asyncio.wait_for(store.all_reading.wait(), 2)  # reading its 3 shards
    assert not running.done()
    stop.set()
    await asyncio.wait_for(running, 2)  # the reads are cancelled at once


class OneNotice(Stuck):
    """One shard holding one notice; reads after it never return."""

    job_shards = 1

    def __init__(self) -> None:
        super().__init__()
        self.notices = [JobNotice(b"1-0", SessionKeys("t", "s"), "job-1")]

    async def read_jobs(self, shard: int, consumer: str, **_: Any) -> list[JobNotice]:
        if self.notices:
            return [self.notices.pop()]
        return await super().read_jobs(shard, consumer)


class HeldJobs:
    """A runner whose jobs run until ``done`` is set."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.done = asyncio.Event()

    async def run_notice(self, notice: JobNotice, *, pace: Any = None) -> Outcome:
        self.started.set()
        await self.done.wait()
        return "written"


async def test_a_stopping_worker_lets_its_running_job_finish_and_acknowledges_it() -> None:
    store, jobs = OneNotice(), HeldJobs()
    worker = Worker(store, jobs, block_ms=5000)
    stop = asyncio.Event()
    running = asyncio.ensure_future(worker.run(stop))
    await asyncio.wait_for(jobs.started.wait(), 2)
    stop.set()
    # A window in which nothing may happen: without a grace the worker would cancel the
    # job and end within a loop turn or two.
    await asyncio.sleep(0.05)
    assert not running.done()  # the job has its grace
    jobs.done.set()
    await asyncio.wait_for(running, 2)
    assert [n.job_id for n in store.acked] == ["job-1"] and worker.processed == 1


async def test_a_job_still_running_after_the_grace_is_cancelled_unacknowledged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("gateway.service.worker.STOP_GRACE_S", 0.1)
    store, jobs = OneNotice(), HeldJobs()
    worker = Worker(store, jobs, block_ms=5000)
    stop = asyncio.Event()
    running = asyncio.ensure_future(worker.run(stop))
    await asyncio.wait_for(jobs.started.wait(), 2)
    stop.set()
    await asyncio.wait_for(running, 2)
    assert store.acked == [] and worker.processed == 0  # left pending: reclaimed later


class FailingJobs:
    """A runner whose first job fails in the gateway's own code, the next ones run."""

    def __init__(self) -> None:
        self.runs = 0
        self.ran_after = asyncio.Event()

    async def run_notice(self, notice: JobNotice, *, pace: Any = None) -> Outcome:
        self.runs += 1
        if self.runs == 1:
            raise AssertionError("a bug in a job's handler")
        self.ran_after.set()
        return "written"


class TwoNotices(OneNotice):
    def __init__(self) -> None:
        super().__init__()
        self.notices = [JobNotice(b"2-0", SessionKeys("t", "s"), "job-2"), *self.notices]


async def test_a_job_that_fails_is_acknowledged_and_the_worker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, jobs = TwoNotices(), FailingJobs()
    worker = Worker(store, jobs, block_ms=5000, concurrency=1)
    stop = asyncio.Event()
    running = asyncio.ensure_future(worker.run(stop))
    await asyncio.wait_for(jobs.ran_after.wait(), 2)  # the worker outlived the failure
    stop.set()
    await asyncio.wait_for(running, 2)  # and stops cleanly, raising nothing
    assert [n.job_id for n in store.acked] == ["job-1", "job-2"]  # not reclaimed forever
    assert "job job-1 failed and is dropped" in caplog.text


class Holding(OneNotice):
    """One notice; holds asked for (a notice whose job waits for its retry) are noted."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[tuple[str, str]] = []

    async def hold_job(self, notice: JobNotice, consumer: str) -> None:
        self.held.append((notice.job_id, consumer))


class RetriedJobs:
    """A runner whose notice's job waits for a retry ``waits`` times, then runs."""

    def __init__(self, waits: int, delay_s: float) -> None:
        self.waits, self.delay_s = waits, delay_s
        self.runs = 0
        self.ran = asyncio.Event()

    async def run_notice(self, notice: JobNotice, *, pace: Any = None) -> Outcome | Later:
        self.runs += 1
        if self.runs <= self.waits:
            return Later(self.delay_s)
        self.ran.set()
        return "written"


async def test_a_notice_whose_job_waits_for_a_retry_is_held_then_handled_again() -> None:
    store, jobs = Holding(), RetriedJobs(waits=2, delay_s=0.01)
    worker = Worker(store, jobs, block_ms=5000, concurrency=1)
    stop = asyncio.Event()
    running = asyncio.ensure_future(worker.run(stop))
    await asyncio.wait_for(jobs.ran.wait(), 2)
    stop.set()
    await asyncio.wait_for(running, 2)
    # Not acknowledged while it waited, held each time (no one takes it for a dead
    # consumer's), acknowledged once its job ran.
    assert store.held == [("job-1", worker.consumer)] * 2
    assert [n.job_id for n in store.acked] == ["job-1"] and worker.processed == 1


async def test_a_stopping_worker_leaves_a_notice_waiting_for_its_retry_unacknowledged() -> None:
    store, jobs = Holding(), RetriedJobs(waits=1, delay_s=60.0)
    worker = Worker(store, jobs, block_ms=5000, reclaim_idle_ms=600_000)
    stop = asyncio.Event()
    running = asyncio.ensure_future(worker.run(stop))
    await until(lambda: store.held, 2, "the notice held for its retry")
    stop.set()
    await asyncio.wait_for(running, 2)  # the wait is cancelled, not waited out
    assert store.acked == [] and jobs.runs == 1  # another worker takes it over
