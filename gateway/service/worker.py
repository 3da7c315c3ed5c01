"""Background summarization: the job runner and the stream consumer that feeds it.

Jobs are at-least-once: a notice in a shard of the job stream (``mg:jobs:{n}``) is
acknowledged only after its job ran, and a consumer that dies leaves its notices pending
until another reclaims them.
Running a job twice is harmless: ``run_job`` returns None when the tiers already hold its
effect, and ``write_tiers`` is a compare-and-set on the tiers' version, so a late or
duplicate job can never overwrite a newer summary. The same runner serves
``POST /memory/sessions/{sid}/flush``, which runs a session's pending jobs in order.

A job that fails (an error in the gateway's code, its deadline passed, its session kept
busy by other writers) is counted in its own record and tried again after a backoff; its
notice stays unacknowledged meanwhile, and the session's later jobs wait for it. Its last
attempt (``worker.job_attempts``) drops it, so that they can go on: a job never blocks its
session for good, and whatever is pending keeps its notice in the stream, where
``/metrics`` counts it. (The summarizer's model failing or answering unusable text is no
failure of the job: the summarizer stores its model-free fallback.)

A notice's cost does not grow with its session's pending jobs: it reads its own job and
the session's oldest (the job order's head), never the whole list.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gateway.config import WorkerConfig
from gateway.errors import EmbeddingsUnavailable
from gateway.memory import durable, rerank
from gateway.memory.jobs import Job, needed_range
from gateway.memory.model import Message, Tiers
from gateway.observability import metrics
from gateway.presets import Composition
from gateway.service.activity import Activity
from gateway.service.ports import Embedder, JobStream, Store
from gateway.store.keys import SessionKeys, UserKeys
from gateway.store.redis_store import JobNotice, StoreUnavailable
from gateway.summarize.run import SummaryWriter, run_job

log = logging.getLogger(__name__)

Outcome = Literal["written", "noop", "done", "gone", "conflict", "dropped"]
# Compare-and-set conflicts mean another writer is busy on the same session; a few
# retries always settle it (each retry re-reads and may find the job already done).
_CAS_ATTEMPTS = 5
# A job's run ends before its lease would: past the lease another runner may take the
# session and run the same job again, and one that never returns held a worker's slot
# (and its shard's loop) for good.
_DEADLINE_SHARE = 0.9


@dataclass(frozen=True, slots=True)
class Later:
    """A notice to handle again in ``delay_s``, unacknowledged meanwhile: the job it leads
    to (its own, or an older one of its session) waits for a retry."""

    delay_s: float


class JobRunner:
    """Runs one job against the session's current tiers and writes the result safely."""

    def __init__(
        self,
        store: Store,
        summarizer: SummaryWriter,
        composition: Composition,
        clock: Callable[[], float] = time.time,
        lease_ms: int = 120_000,
        embedder: Embedder | None = None,
        *,
        attempts: int = 3,
        backoff_s: float = 5.0,
        backoff_most_s: float = 30.0,
    ) -> None:
        self.store = store
        self.summarizer = summarizer
        self.composition = composition
        self.clock = clock
        # Longer than a job can take (a few summarizer calls, each with its timeout):
        # a runner that dies holding it only delays the session's jobs this long.
        self.lease_ms = lease_ms
        self.deadline_s = lease_ms / 1000 * _DEADLINE_SHARE
        self.embedder = embedder
        # A failed job's attempts in all, and its backoff: the first, and the longest.
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.backoff_most_s = backoff_most_s
        # Leases this runner could not release because Redis was down. With AOF, Redis
        # comes back still holding them: released on the next run, not left to block the
        # session's jobs (and its flushes) for lease_ms.
        self._unreleased: dict[SessionKeys, str] = {}

    async def run(self, keys: SessionKeys, job: Job, *, early: bool = False) -> Outcome | Later:
        """Run the job under the session's lease; wait while someone else holds it.

        A failure is counted (while the lease is held, so that no runner waiting for it
        runs the job again before its backoff): the job is tried again later (``Later``)
        or, on its last attempt, dropped. ``Later`` too when the job waits for a retry,
        unless ``early`` (a flush runs it now). Redis being unavailable is no failure of
        the job: ``StoreUnavailable`` is raised, and the caller leaves it for later."""
        if job.kind == "end":
            # Its session's other jobs first, each within its own deadline: the end's is
            # for what it does itself (the final summary, the user's profile).
            await self.flush_summaries(keys)
            return await self._guarded(keys, job, functools.partial(self._end_job, keys, job))
        if job.kind == "embed":
            return await self._guarded(keys, job, functools.partial(self._embed, keys, job))
        await self._release_leftovers()
        holder = secrets.token_hex(8)
        deadline = time.monotonic() + self.lease_ms / 1000
        while not await self._take_lease(keys, holder):
            # Another runner works on this session (a flush and the worker, say): wait for
            # it rather than pay the summarizer twice; the job may be done when we get in.
            if time.monotonic() > deadline:
                return await self._failed(keys, job, "conflict", "its session stayed leased")
            await asyncio.sleep(0.05)
        try:
            leased = functools.partial(self._run_leased, keys, job, early)
            return await self._guarded(keys, job, leased)
        finally:
            try:
                await self.store.queue.release_lease(keys, holder)
            except StoreUnavailable:
                self._unreleased[keys] = holder
                raise

    async def _take_lease(self, keys: SessionKeys, holder: str) -> bool:
        try:
            return await self.store.queue.take_lease(keys, holder, self.lease_ms)
        except StoreUnavailable:
            # The lease may have been set with only its reply lost (Redis killed after the
            # write; with AOF it comes back holding it): released like any leftover, or
            # every flush of the session would wait out lease_ms for a holder long gone.
            self._unreleased[keys] = holder
            raise

    async def _release_leftovers(self) -> None:
        # Several jobs run at once (shards, concurrency): each takes an entry out before
        # its await, so no two release (or forget) the same one.
        while self._unreleased:
            keys, holder = self._unreleased.popitem()
            try:
                await self.store.queue.release_lease(keys, holder)  # only if still ours (a script)
            except StoreUnavailable:
                self._unreleased.setdefault(keys, holder)
                raise

    async def _guarded(
        self, keys: SessionKeys, job: Job, work: Callable[[], Awaitable[Outcome | Later]]
    ) -> Outcome | Later:
        """``work``, within the job's deadline, its failure counted."""
        try:
            async with asyncio.timeout(self.deadline_s):
                outcome = await work()
        except StoreUnavailable:
            raise
        except TimeoutError:
            return await self._failed(keys, job, "timeout", "its deadline passed")
        except Exception as error:
            # The traceback only at DEBUG: an exception's text may quote what it was given.
            log.debug("job %s failed", job.id, exc_info=True)
            return await self._failed(keys, job, "error", type(error).__name__)
        if outcome == "conflict":
            return await self._failed(keys, job, "conflict", "other writers kept its tiers")
        return outcome

    async def _failed(self, keys: SessionKeys, job: Job, reason: str, why: str) -> Outcome | Later:
        metrics.job_failed(reason)
        now = self.clock()
        failed = await self.store.queue.fail_job(
            keys, job.id, allowed=self.attempts, now=now, backoff_s=self.backoff_s,
            most_s=self.backoff_most_s,
        )  # fmt: skip
        if failed.attempts == 0:
            return "done"  # another runner finished it meanwhile
        if failed.dropped:
            metrics.job_dropped(reason)
            log.warning(
                "job %s dropped after %d failed attempts (the last: %s); the session's "
                "later jobs go on without it", job.id, failed.attempts, why,
            )  # fmt: skip
            return "dropped"
        wait = max(failed.retry_at - now, 0.0)
        log.info(
            "job %s failed (%s), attempt %d of %d: tried again in %.1f s",
            job.id, why, failed.attempts, self.attempts, wait,
        )  # fmt: skip
        return Later(wait)

    async def _run_leased(self, keys: SessionKeys, job: Job, early: bool) -> Outcome | Later:
        for _ in range(_CAS_ATTEMPTS):
            exists, tiers, pending = await self.store.sessions.job_view(keys, job.id)
            if not exists:
                return "gone"
            if pending is None:
                return "done"  # another worker (or a flush) finished it
            wait = pending.retry_at - self.clock()
            if wait > 0 and not early:
                return Later(wait)  # it failed while we waited for the lease
            start, end = needed_range(job, tiers)
            messages = await self.store.sessions.messages(keys, start, end)
            updated = await run_job(
                job, self.composition, tiers, messages, self.summarizer, now=self.clock()
            )
            if updated is None:
                await self.store.queue.finish_job(keys, job)
                return "noop"
            result = await self.store.sessions.write_tiers(keys, tiers.version, updated, job)
            if result == 1:
                return "written"
            if result == -1:
                return "gone"
        return "conflict"

    async def _end_job(self, keys: SessionKeys, job: Job) -> Outcome:
        await self.end(keys)
        await self.store.queue.finish_job(keys, job)
        return "written"

    async def _embed(self, keys: SessionKeys, job: Job) -> Outcome:
        """Vectors of newly recorded messages, for recall's reranking."""
        if self.embedder is not None:
            stored = await self.store.sessions.messages(keys, job.start, job.end)
            messages = [m for m in stored if m.text]
            try:
                vectors = await self.embedder.embed([m.text for m in messages])
            except EmbeddingsUnavailable as error:
                # Recall stays lexical for these messages: no retry storm on a dead model.
                log.warning("embeddings not made for %s: %s", job.id, error)
            else:
                packed = {m.index: rerank.pack(v) for m, v in zip(messages, vectors, strict=True)}
                await self.store.sessions.save_vectors(keys, packed)
        await self.store.queue.finish_job(keys, job)
        return "written"

    async def flush(self, keys: SessionKeys) -> int:
        """Run the session's pending jobs now, oldest first, whatever their backoff, its
        end last; how many were pending. One that fails and is not dropped stops the
        flush: the later ones wait for its retry, as in the worker."""
        _, _, pending = await self.store.sessions.job_state(keys)
        end = next((job for job in pending if job.kind == "end"), None)
        if await self._run_summaries(keys, pending) and end is not None:
            await self.run(keys, end, early=True)
        return len(pending)

    async def end(self, keys: SessionKeys) -> None:
        """Close a session (seed 001): its final summary and facts go to its user's history,
        and the user's cross-session profile is rebuilt from their last sessions."""
        await self.flush_summaries(keys)
        meta = await self.store.sessions.meta(keys)
        if not meta:
            return  # erased meanwhile
        now = self.clock()
        user_id = meta.get("user_id")
        cross = self.composition.cross_session
        if user_id and cross is not None:
            _, tiers = await self.store.sessions.tiers(keys)
            user = UserKeys(keys.tenant, user_id)
            history = await self.store.users.user_history(user)
            count, recent = await self.store.sessions.tail(keys, 10)
            entry = {
                "session_id": keys.session_id,
                "ended": now,
                "message_count": count,
                "summary": await self._final_summary(tiers, recent),
                "facts": [f.text for f in durable.current(tiers.facts)],
            }
            entries = [entry, *(h for h in history if h.get("session_id") != keys.session_id)]
            entries = entries[: cross.sessions]
            merged = await self.summarizer.merge([e["summary"] for e in entries if e["summary"]])
            profile = {
                "summary": merged.text,
                "facts": durable.union([e["facts"] for e in reversed(entries)], keep=20),
                "sessions": [e["session_id"] for e in entries],
            }
            await self.store.users.save_user_history(user, entry, profile, keep=cross.sessions)
        ended = await self.store.sessions.end_session(keys, now)
        if user_id:
            user = UserKeys(keys.tenant, user_id)
            if ended:  # no longer among the user's sessions that may go idle
                await self.store.users.leave_active(user, keys.session_id)
            else:
                # Erased while we summarized: what we just wrote to the user's memory goes
                # too (the erasure removes the session first, then its traces, so one of
                # the two always sees the other's work).
                await self.store.users.forget_user_session(user, keys.session_id)

    async def flush_summaries(self, keys: SessionKeys) -> None:
        _, _, pending = await self.store.sessions.job_state(keys)
        await self._run_summaries(keys, pending)

    async def _run_summaries(self, keys: SessionKeys, jobs: list[Job]) -> bool:
        """``jobs`` in their order, the session's end left out (it runs last, or alone);
        False when one failed and waits for its retry (the rest were not run)."""
        for job in jobs:
            if job.kind != "end" and isinstance(await self.run(keys, job, early=True), Later):
                return False
        return True

    async def _final_summary(self, tiers: Tiers, recent: list[Message]) -> str:
        """The session in a few lines: its evolving summary, its newest chunk summaries, or
        (a short session) a summary of its last messages."""
        if tiers.rolling is not None:
            return tiers.rolling.text
        if tiers.summaries:
            return "\n".join(s.text for s in reversed(tiers.summaries[-2:]))
        return (await self.summarizer.chunk(recent)).text if recent else ""

    async def run_notice(
        self, notice: JobNotice, *, pace: Callable[[], Awaitable[object]] | None = None
    ) -> Outcome | Later:
        """The job a notice names, after the session's older pending jobs: their own
        notices may have been lost (a cluster master that failed as the turn was recorded
        on another), and a session's jobs are made in order anyway. Each step reads the
        session's oldest job, not its list: a notice costs the same however many wait.
        ``pace`` is awaited before each job (``Worker.requests_first``).

        ``Later`` when the next job to run waits for a retry (a backoff after it failed)."""
        keys = notice.keys
        head = await self.store.queue.job_head(keys, notice.job_id)
        # Each step but the last takes an older job off the list: never more steps than
        # jobs (more would mean a job that stays after it ran; then ask again later).
        for _ in range(head.count):
            own = head.own
            if own is None:
                return "done"
            # The session's end runs after its other jobs (it flushes them itself).
            step = own if own.job.kind == "end" or head.oldest is None else head.oldest
            wait = step.retry_at - self.clock()
            if wait > 0:
                return Later(wait)
            if pace is not None:
                await pace()
            outcome = await self.run(keys, step.job)
            if step.job.id == own.job.id or isinstance(outcome, Later) or outcome == "gone":
                return outcome
            head = await self.store.queue.job_head(keys, notice.job_id)
        return "done" if head.own is None else Later(self.backoff_s)


# How long a stopping worker waits for its jobs in flight before cancelling them.
STOP_GRACE_S = 5.0


class NoticeRunner(Protocol):
    """What the worker needs of a job runner (``JobRunner.run_notice``)."""

    async def run_notice(
        self, notice: JobNotice, *, pace: Callable[[], Awaitable[object]] | None = None
    ) -> Outcome | Later: ...


class Worker:
    """Consumes the job stream's shards: new notices, and those a crashed consumer left
    behind. One loop per shard (a blocking read each); ``concurrency`` jobs at most run
    at once over all of them."""

    def __init__(
        self,
        queue: JobStream,
        runner: NoticeRunner,
        *,
        concurrency: int = 4,
        block_ms: int = 1000,
        reclaim_idle_ms: int = 60_000,
        consumer: str | None = None,
        requests_first: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.queue = queue
        self.runner = runner
        self.concurrency = concurrency
        self.block_ms = block_ms
        self.reclaim_idle_ms = reclaim_idle_ms
        # Awaited before each job starts: in ``serve``, until the loop has no turn to
        # serve (``activity.Activity.quiet``); None: at once (a worker process of its own).
        self.requests_first = requests_first
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.processed = 0
        self._slots = asyncio.Semaphore(concurrency)
        # Notices whose job waits for a retry: each handled again after its delay.
        self._waiting: set[asyncio.Future[None]] = set()

    @classmethod
    def from_config(
        cls,
        store: Store,
        runner: NoticeRunner,
        config: WorkerConfig,
        activity: Activity | None = None,
    ) -> Worker:
        """``activity``: the requests this worker's process serves (the in-process
        worker's), which its jobs give way to for up to ``worker.yield_max_s``."""
        requests_first = None
        if activity is not None and config.yield_max_s > 0:
            requests_first = functools.partial(activity.quiet, config.yield_max_s)
        return cls(
            store.queue,
            runner,
            concurrency=config.concurrency,
            block_ms=config.block_ms,
            reclaim_idle_ms=int(config.reclaim_idle_s * 1000),
            requests_first=requests_first,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop`` is set; then each loop cancels its blocked read at once (see
        ``_read``) and finishes its jobs, for up to ``STOP_GRACE_S`` more, and is cancelled
        past that: a call still waiting on a Redis node that went away must not hold up a
        shutdown. A job cut short was not acknowledged: another worker takes it over."""
        shards = range(self.queue.job_shards)
        consumers = [asyncio.ensure_future(self._consume(shard, stop)) for shard in shards]
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([*consumers, stopping], return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                await asyncio.wait(consumers, timeout=STOP_GRACE_S)
        finally:
            # Notices waiting for a retry stay unacknowledged: another worker takes them.
            tasks: list[asyncio.Future[Any]] = [*consumers, stopping, *self._waiting]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in consumers:  # a loop that failed on its own: said, not swallowed
            error = None if task.cancelled() else task.exception()
            if error is not None:
                raise error

    async def _consume(self, shard: int, stop: asyncio.Event) -> None:
        group_ready = False
        last_reclaim = 0.0
        while not stop.is_set():
            try:
                if not group_ready:
                    await self.queue.ensure_group(shard)
                    group_ready = True
                notices: list[JobNotice] = []
                if time.monotonic() - last_reclaim > self.reclaim_idle_ms / 2000:
                    last_reclaim = time.monotonic()
                    notices = await self.queue.reclaim_jobs(
                        shard, self.consumer, min_idle_ms=self.reclaim_idle_ms,
                        count=self.concurrency,
                    )  # fmt: skip
                if not notices:
                    notices = await self._read(shard, stop)
                await asyncio.gather(*(self._handle(n) for n in notices))
            except StoreUnavailable as error:
                # A Redis that comes back empty (no persistence, a failover) has lost the
                # consumer group: make it again (a no-op if it exists) before reading.
                group_ready = False
                log.warning("worker: redis unavailable (job shard %d): %s", shard, error)
                await _sleep_or_stop(stop, 1.0)

    async def _read(self, shard: int, stop: asyncio.Event) -> list[JobNotice]:
        """The shard's new notices, waiting up to ``block_ms`` for one; none once ``stop``
        is set, without waiting out the block.

        Cancelling the read leaves nothing behind on the connection: redis-py closes a
        connection whose reply was cut short (no later command can read this one's reply)
        and Redis hands nothing to a blocked client that went away. A reply already on its
        way is lost with the connection: its notices stay pending, and are reclaimed after
        ``reclaim_idle_ms`` like a crashed consumer's.
        """
        read = asyncio.ensure_future(
            self.queue.read_jobs(
                shard, self.consumer, count=self.concurrency, block_ms=self.block_ms
            )
        )
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([read, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not read.done():
                read.cancel()
            await asyncio.gather(read, stopped, return_exceptions=True)
        # Notices that came with the stop are handled: that is what the grace is for.
        return [] if read.cancelled() else read.result()

    async def _handle(self, notice: JobNotice) -> None:
        async with self._slots:
            try:
                outcome = await self.runner.run_notice(notice, pace=self.requests_first)
            except StoreUnavailable as error:
                # Not acknowledged: the notice stays pending and is reclaimed later.
                log.warning("job %s not run: %s", notice.job_id, error)
                metrics.job_failed("redis_unavailable")
                return
            except Exception:
                # A job's own failures are the runner's to retry and drop; this is one of
                # the runner's bookkeeping, which would fail again on every reclaim: said
                # (with its traceback, no content) and acknowledged, so that one notice
                # cannot stop the worker, and every session's summaries, with it.
                log.exception("job %s failed and is dropped", notice.job_id)
                metrics.job_failed("error")
                outcome = "done"
            if isinstance(outcome, Later):
                self._again_later(notice, outcome.delay_s)
                return
            await self.queue.ack_job(notice)
            self.processed += 1
            log.debug("job %s: %s", notice.job_id, outcome)

    def _again_later(self, notice: JobNotice, delay_s: float) -> None:
        """Handle ``notice`` again after ``delay_s``, holding no slot meanwhile. At most
        half of ``reclaim_idle_ms``: held in between, it is never reclaimed from us."""
        delay_s = min(delay_s, self.reclaim_idle_ms / 2000)
        task = asyncio.ensure_future(self._again(notice, delay_s))
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def _again(self, notice: JobNotice, delay_s: float) -> None:
        try:
            await self.queue.hold_job(notice, self.consumer)
            await asyncio.sleep(delay_s)  # the backoff itself
            await self._handle(notice)
        except StoreUnavailable as error:
            # Still unacknowledged: reclaimed after reclaim_idle_ms, by us or another.
            log.warning("job %s not run again yet: %s", notice.job_id, error)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):  # the usual case: time is up, not stopped
        await asyncio.wait_for(stop.wait(), seconds)
