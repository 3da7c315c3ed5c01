"""A session's pending jobs as the worker reads them, one at a time whatever their number:
a job's record with its failed attempts, the head of the session's job order, and what a
failed attempt did (the replies of ``job_head.lua`` and ``fail_job.lua``, decoded; pure).

A job's record is its JSON in the session's jobs hash (``Job.to_data``); a failed attempt
adds ``attempts`` and ``retry_at`` to it, which ``Job.from_data`` leaves aside.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.memory.jobs import Job


@dataclass(frozen=True, slots=True)
class Pending:
    """A pending job, with its failed attempts so far and when it may be tried again."""

    job: Job
    attempts: int = 0
    retry_at: float = 0.0  # seconds since the epoch; 0: now

    @classmethod
    def from_json(cls, raw: bytes | str) -> Pending:
        data = json.loads(raw)
        return cls(
            Job.from_data(data), int(data.get("attempts", 0)), float(data.get("retry_at", 0))
        )


@dataclass(frozen=True, slots=True)
class JobHead:
    """A notice's job and its session's oldest: what the runner reads before each step."""

    own: Pending | None  # the notice's job; None: no longer pending
    oldest: Pending | None  # the session's oldest pending job that is not its end
    count: int  # the session's pending jobs

    @classmethod
    def decode(cls, reply: list[Any]) -> JobHead:
        own, head, count = reply
        listed = [Pending.from_json(raw) for raw in head[1::2]]
        oldest = next((p for p in listed if p.job.kind != "end"), None)
        return cls(Pending.from_json(own) if own else None, oldest, int(count))


@dataclass(frozen=True, slots=True)
class Failed:
    """What ``fail_job.lua`` made of a failed attempt."""

    attempts: int  # 0: the job was no longer pending
    retry_at: float  # when it may be tried again (not dropped)
    dropped: bool

    @classmethod
    def decode(cls, reply: list[Any], allowed: int) -> Failed:
        attempts, retry_at = int(reply[0]), float(reply[1])
        return cls(attempts, retry_at, attempts >= allowed)
