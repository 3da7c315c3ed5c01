"""Background summarization: the job runner and the stream consumer that feeds it.

Jobs are at-least-once: a notice in a shard of the job stream (``mg:jobs:{n}``) is
acknowledged only after its job ran, and a consumer that dies leaves its notices pending
until another reclaims them.
Running a job twice is harmless: ``run_job`` returns None when the tiers already hold its
effect, and ``write_tiers`` is a compare-and-set on the tiers' version, so a late or
duplicate job can never overwrite a newer summary. The same runner serves
``POST /memory/sessions/{sid}/flush``, which runs a session's pending jobs in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Literal, Protocol

from gateway.config import WorkerConfig
from gateway.errors import EmbeddingsUnavailable
from gateway.memory import durable, rerank
from gateway.memory.jobs import Job, needed_range
from gateway.memory.model import Message, Tiers
from gateway.observability import metrics
from gateway.presets import Composition
from gateway.service.ports import Embedder, JobStream, Store
from gateway.store.keys import SessionKeys, UserKeys
from gateway.store.redis_store import JobNotice, StoreUnavailable
from gateway.summarize.run import SummaryWriter, run_job

log = logging.getLogger(__name__)

Outcome = Literal["written", "noop", "done", "gone", "conflict"]
# Compare-and-set conflicts mean another writer is busy on the same session; a few
# retries always settle it (each retry re-reads and may find the job already done).
_CAS_ATTEMPTS = 5


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
    ) -> None:
        self.store = store
        self.summarizer = summarizer
        self.composition = composition
        self.clock = clock
        # Longer than a job can take (a few summarizer calls, each with its timeout):
        # a runner that dies holding it only delays the session's jobs this long.
        self.lease_ms = lease_ms
        self.embedder = embedder
        # Leases this runner could not release because Redis was down. With AOF, Redis
        # comes back still holding them: released on the next run, not left to block the
        # session's jobs (and its flushes) for lease_ms.
        self._unreleased: dict[SessionKeys, str] = {}

    async def run(self, keys: SessionKeys, job: Job) -> Outcome:
        """Run the job under the session's lease; wait while someone else holds it."""
        if job.kind == "end":
            await self.end(keys)
            await self.store.queue.finish_job(keys, job)
            return "written"
        if job.kind == "embed":
            return await self._embed(keys, job)
        await self._release_leftovers()
        holder = secrets.token_hex(8)
        deadline = time.monotonic() + self.lease_ms / 1000
        while not await self._take_lease(keys, holder):
            # Another runner works on this session (a flush and the worker, say): wait for
            # it rather than pay the summarizer twice; the job may be done when we get in.
            if time.monotonic() > deadline:
                return "conflict"
            await asyncio.sleep(0.05)
        try:
            return await self._run_leased(keys, job)
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

    async def _run_leased(self, keys: SessionKeys, job: Job) -> Outcome:
        for _ in range(_CAS_ATTEMPTS):
            exists, tiers, pending = await self.store.sessions.job_state(keys)
            if not exists:
                return "gone"
            if job.id not in {p.id for p in pending}:
                return "done"  # another worker (or a flush) finished it
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
        """Run the session's pending jobs now, oldest first; how many ran."""
        _, _, pending = await self.store.sessions.job_state(keys)
        await self._run_summaries(keys, pending)
        if any(job.kind == "end" for job in pending):
            await self.run(keys, next(job for job in pending if job.kind == "end"))
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
            _, tiers, _ = await self.store.sessions.job_state(keys)
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

    async def _run_summaries(self, keys: SessionKeys, jobs: list[Job]) -> None:
        """``jobs`` in their order, the session's end left out (it runs last, or alone)."""
        for job in jobs:
            if job.kind != "end":
                await self.run(keys, job)

    async def _final_summary(self, tiers: Tiers, recent: list[Message]) -> str:
        """The session in a few lines: its evolving summary, its newest chunk summaries, or
        (a short session) a summary of its last messages."""
        if tiers.rolling is not None:
            return tiers.rolling.text
        if tiers.summaries:
            return "\n".join(s.text for s in reversed(tiers.summaries[-2:]))
        return (await self.summarizer.chunk(recent)).text if recent else ""

    async def run_notice(self, notice: JobNotice) -> Outcome:
        """The job a notice names, after the session's older pending jobs: their own
        notices may have been lost (a cluster master that failed as the turn was recorded
        on another), and a session's jobs are made in order anyway."""
        _, _, pending = await self.store.sessions.job_state(notice.keys)
        job = next((p for p in pending if p.id == notice.job_id), None)
        if job is None:
            return "done"
        await self._run_summaries(notice.keys, pending[: pending.index(job)])
        return await self.run(notice.keys, job)


# How long a stopping worker waits for its jobs in flight before cancelling them.
STOP_GRACE_S = 5.0


class NoticeRunner(Protocol):
    """What the worker needs of a job runner (``JobRunner.run_notice``)."""

    async def run_notice(self, notice: JobNotice) -> Outcome: ...


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
    ) -> None:
        self.queue = queue
        self.runner = runner
        self.concurrency = concurrency
        self.block_ms = block_ms
        self.reclaim_idle_ms = reclaim_idle_ms
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.processed = 0
        self._slots = asyncio.Semaphore(concurrency)

    @classmethod
    def from_config(cls, store: Store, runner: NoticeRunner, config: WorkerConfig) -> Worker:
        return cls(
            store.queue,
            runner,
            concurrency=config.concurrency,
            block_ms=config.block_ms,
            reclaim_idle_ms=int(config.reclaim_idle_s * 1000),
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
            for task in [*consumers, stopping]:
                task.cancel()
            await asyncio.gather(*consumers, stopping, return_exceptions=True)
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
                outcome = await self.runner.run_notice(notice)
            except StoreUnavailable as error:
                # Not acknowledged: the notice stays pending and is reclaimed later.
                log.warning("job %s not run: %s", notice.job_id, error)
                metrics.job_failed("redis_unavailable")
                return
            except Exception:
                # A job that fails in the gateway's own code would fail again on every
                # reclaim: said (with its traceback, no content) and acknowledged, so that
                # one job cannot stop the worker, and every session's summaries, with it.
                log.exception("job %s failed and is dropped", notice.job_id)
                metrics.job_failed("error")
                outcome = "done"
            if outcome == "conflict":  # it gave up on a session other writers kept busy
                metrics.job_failed("conflict")
            await self.queue.ack_job(notice)
            self.processed += 1
            log.debug("job %s: %s", notice.job_id, outcome)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):  # the usual case: time is up, not stopped
        await asyncio.wait_for(stop.wait(), seconds)
