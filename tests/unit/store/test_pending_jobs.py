"""The replies of job_head.lua and fail_job.lua, decoded (store/pending_jobs.py)."""

from __future__ import annotations

import json

from gateway.memory.jobs import Job
from gateway.store.pending_jobs import Failed, JobHead, Pending

FOLD = Job("fold", 3, 4, 4, 2, 3)
END = Job("end", 0, 0, 0)


def raw(job: Job, **extra: float) -> bytes:
    return json.dumps({**job.to_data(), **extra}).encode()


def test_a_job_written_by_the_record_has_no_attempts_yet() -> None:
    assert Pending.from_json(raw(FOLD)) == Pending(FOLD, 0, 0.0)
    assert Pending.from_json(raw(FOLD, attempts=2, retry_at=12.5)) == Pending(FOLD, 2, 12.5)


def test_the_head_skips_the_sessions_end_which_runs_after_the_others() -> None:
    head = JobHead.decode([raw(FOLD), [END.id.encode(), raw(END), b"fold", raw(FOLD)], 2])
    assert head == JobHead(Pending(FOLD), Pending(FOLD), 2)
    alone = JobHead.decode([raw(END), [END.id.encode(), raw(END)], 1])
    assert alone.own == Pending(END) and alone.oldest is None


def test_a_job_no_longer_pending_has_no_head() -> None:
    assert JobHead.decode([None, [], 0]) == JobHead(None, None, 0)


def test_a_failed_attempt_is_a_drop_on_the_last_allowed() -> None:
    assert Failed.decode([1, b"105.250"], allowed=3) == Failed(1, 105.25, False)
    assert Failed.decode([3, b"0"], allowed=3).dropped
    assert Failed.decode([0, b"0"], allowed=3) == Failed(0, 0.0, False)
