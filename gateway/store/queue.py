"""The job queue: a session's pending jobs (its jobs hash is the record, its job order
the sequence they run in), their notices on the sharded job stream, the workers' consumer
group, and the per-session lease that lets one runner at a time work on a session.

The record's round trip announces its predicted jobs itself (``announce``: commands sent
with the record's). The worker's reads of the stream (a blocking ``XREADGROUP``, which
would hold a shared connection) go through redis-py's own pool.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from gateway.memory.jobs import Job
from gateway.store.backlog import JobBacklog, backlog_commands, backlogs_from
from gateway.store.calls import StoreCalls
from gateway.store.keys import JOB_GROUP, SessionKeys, UserKeys, job_shard, job_stream
from gateway.store.link import Command
from gateway.store.pending_jobs import Failed, JobHead

# The job stream is a notice board, not the record (each session's jobs hash is):
# trimming each shard approximately keeps it bounded when no worker runs.
STREAM_MAXLEN = 100_000


@dataclass(frozen=True, slots=True)
class JobNotice:
    entry_id: bytes
    keys: SessionKeys
    job_id: str
    shard: int = 0  # the job-stream shard it was read from


def _notice(shard: int, entry_id: bytes, fields: dict[bytes, bytes]) -> JobNotice:
    keys = SessionKeys(fields[b"tenant"].decode(), fields[b"sid"].decode())
    return JobNotice(entry_id, keys, fields[b"job"].decode(), shard)


def announce(keys: SessionKeys, jobs: Sequence[Job], shards: int) -> list[Command]:
    """The notices of a session's jobs, after the commands that made them pending."""
    stream = job_stream(job_shard(keys, shards))
    notice = ("tenant", keys.tenant, "sid", keys.session_id)
    return [
        ("XADD", stream, "MAXLEN", "~", STREAM_MAXLEN, "*", *notice, "job", job.id) for job in jobs
    ]


class JobQueue:
    """The job stream, its consumer group, and the sessions' leases."""

    def __init__(self, calls: StoreCalls) -> None:
        self._calls = calls

    @property
    def job_shards(self) -> int:
        """How many streams the notices are spread over (``worker.job_shards``)."""
        return self._calls.job_shards

    async def enqueue(self, keys: SessionKeys, jobs: Sequence[Job]) -> None:
        """Remember the session's pending jobs and notify the workers (one round trip)."""

        pending = [part for job in jobs for part in (job.id, json.dumps(job.to_data()))]
        ordered = [part for job in jobs for part in (job.trigger, job.id)]
        commands: list[Command] = [
            ("HSET", keys.jobs, *pending),
            ("EXPIRE", keys.jobs, self._calls.retention_s),
            ("ZADD", keys.job_order, *ordered),
            ("EXPIRE", keys.job_order, self._calls.retention_s),
            *announce(keys, jobs, self._calls.job_shards),
        ]
        await self._calls.execute(commands, op="enqueue")

    async def end_sessions(self, user: UserKeys, session_ids: Sequence[str], end: Job) -> None:
        """Queue the ``end`` job of each of a user's sessions, which leave the user's
        active index (a session that gets a turn again rejoins it); one round trip."""

        if not session_ids:
            return
        commands: list[Command] = []
        for session_id in session_ids:
            keys = SessionKeys(user.tenant, session_id)
            commands.append(("HSET", keys.jobs, end.id, json.dumps(end.to_data())))
            commands.append(("EXPIRE", keys.jobs, self._calls.retention_s))
            commands.append(("ZADD", keys.job_order, end.trigger, end.id))
            commands.append(("EXPIRE", keys.job_order, self._calls.retention_s))
            commands += announce(keys, [end], self._calls.job_shards)
        commands.append(("ZREM", user.active, *session_ids))
        await self._calls.execute(commands, op="end_sessions")

    async def finish_job(self, keys: SessionKeys, job: Job) -> None:
        commands = [("HDEL", keys.jobs, job.id), ("ZREM", keys.job_order, job.id)]
        await self._calls.execute(commands, op="finish_job")

    async def job_head(self, keys: SessionKeys, job_id: str) -> JobHead:
        """The job ``job_id`` and the session's oldest pending one (one round trip, the
        same cost however many jobs are pending)."""
        names = [keys.jobs, keys.job_order]
        call = self._calls.script("job_head", names, [job_id, self._calls.retention_s])
        (reply,) = await self._calls.execute([call], op="job_head")
        return JobHead.decode(reply)

    async def fail_job(
        self, keys: SessionKeys, job_id: str, *, allowed: int, now: float, backoff_s: float,
        most_s: float,
    ) -> Failed:  # fmt: skip
        """Count a failed attempt at a pending job: it may be tried again after a backoff
        (``backoff_s``, doubling with each attempt, at most ``most_s``) or, on its
        ``allowed``-th attempt, it is dropped."""
        names = [keys.jobs, keys.job_order]
        args = [job_id, allowed, repr(now), repr(backoff_s), repr(most_s)]
        (reply,) = await self._calls.execute(
            [self._calls.script("fail_job", names, args)], op="fail_job"
        )
        return Failed.decode(reply, allowed)

    async def take_lease(self, keys: SessionKeys, holder: str, ttl_ms: int) -> bool:
        """One runner at a time per session: no duplicate summarizer calls, jobs in order."""
        command = ("SET", keys.lease, holder, "NX", "PX", ttl_ms)
        (taken,) = await self._calls.execute([command], op="take_lease")
        return bool(taken)

    async def release_lease(self, keys: SessionKeys, holder: str) -> None:
        await self._calls.execute(
            [self._calls.script("release", [keys.lease], [holder])], op="release_lease"
        )

    async def ensure_group(self, shard: int) -> None:
        async def create() -> None:
            try:
                await self._calls.client.xgroup_create(
                    job_stream(shard), JOB_GROUP, id="0", mkstream=True
                )
            except ResponseError as error:
                if "BUSYGROUP" not in str(error):  # the group exists: fine
                    raise

        await self._calls.bounded(create, op="ensure_group")

    async def read_jobs(
        self, shard: int, consumer: str, *, count: int, block_ms: int
    ) -> list[JobNotice]:
        stream = job_stream(shard)
        raw: Any = await self._calls.bounded(
            lambda: self._calls.client.xreadgroup(
                JOB_GROUP, consumer, {stream: ">"}, count=count, block=block_ms
            ),
            op="read_jobs",
            timeout_s=self._calls.timeout_s + block_ms / 1000,
        )
        return [
            _notice(shard, entry, fields) for _, entries in raw or () for entry, fields in entries
        ]

    async def reclaim_jobs(
        self, shard: int, consumer: str, *, min_idle_ms: int, count: int
    ) -> list[JobNotice]:
        """Take over jobs a crashed consumer read but never acknowledged."""
        result: Any = await self._calls.bounded(
            lambda: self._calls.client.xautoclaim(
                job_stream(shard), JOB_GROUP, consumer, min_idle_ms, start_id="0-0", count=count
            ),
            op="reclaim_jobs",
        )
        return [_notice(shard, entry, fields) for entry, fields in result[1] if fields]

    async def hold_job(self, notice: JobNotice, consumer: str) -> None:
        """Keep a notice read but not acknowledged (its job waits for a retry) from
        looking like a crashed consumer's: its idle time starts again (``XCLAIM JUSTID``
        keeps its delivery count)."""
        stream = job_stream(notice.shard)
        command = ("XCLAIM", stream, JOB_GROUP, consumer, 0, notice.entry_id, "JUSTID")
        await self._calls.execute([command], op="hold_job")

    async def ack_job(self, notice: JobNotice) -> None:
        stream = job_stream(notice.shard)

        commands = [("XACK", stream, JOB_GROUP, notice.entry_id), ("XDEL", stream, notice.entry_id)]
        await self._calls.execute(commands, op="ack_job")

    async def backlog(self, *, timeout_s: float) -> dict[int, JobBacklog]:
        """Each shard's backlog, in one round trip (on a cluster, one to each master
        holding a shard, at once) under ``timeout_s``."""
        shards = self._calls.job_shards
        # An error reply (a shard with no stream yet) is returned in its place.
        replies = await self._calls.execute(
            backlog_commands(shards), op="job_backlog", needed=0, timeout_s=timeout_s
        )
        return backlogs_from(replies, shards)
