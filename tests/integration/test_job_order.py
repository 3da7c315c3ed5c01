"""A session's job order (``joborder``) beside its jobs hash, and the scripts that read
and count a failed attempt (``job_head.lua``, ``fail_job.lua``), on one Redis and on a
Redis Cluster: every key they touch is in the session's slot."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devsupport.servers import RedisProcess
from gateway.memory.jobs import Job
from gateway.presets import PRESETS
from gateway.service.worker import JobRunner
from gateway.store.keys import SessionKeys, UserKeys
from gateway.store.redis_store import RedisStore
from gateway.summarize.summarizer import Summarizer
from gateway.text.tokens import TokenCounter
from tests.support.fixtures import on_one_redis_and_a_cluster
from tests.support.jobs import notices_withdrawn
from tests.support.recorded_turns import Turns

redis_server = on_one_redis_and_a_cluster()
ROLLING = PRESETS["rolling-summary"]
END = Job("end", 0, 0, 0)


@pytest.fixture
def admin(redis_server: RedisProcess) -> Iterator[Any]:
    """A client of the test's Redis (or cluster); the notices the test announces are
    withdrawn after it (no other test's worker runs them)."""
    client = redis_server.client()
    with notices_withdrawn(redis_server.client):
        yield client
    client.close()


def keys_of(name: str) -> SessionKeys:
    return SessionKeys("tenant-job-order", f"{name}-{uuid.uuid4().hex[:8]}")


def order(admin: Any, keys: SessionKeys) -> list[str]:
    return [member.decode() for member in admin.zrange(keys.job_order, 0, -1)]


def hashed(admin: Any, keys: SessionKeys) -> list[str]:
    """The jobs hash's ids in the order the runner takes them: (trigger, id)."""
    jobs = [Job.from_data(json.loads(raw)) for raw in admin.hvals(keys.jobs)]
    return [job.id for job in sorted(jobs, key=lambda job: (job.trigger, job.id))]


async def test_the_order_follows_every_write_of_the_jobs_hash(
    store: RedisStore, admin: Any
) -> None:
    session = Turns(store, ROLLING, keys_of("follows"))
    for _ in range(3):  # record.lua writes each turn's job
        await session.add()
    extra = Job("facts", 1, 6, 6)
    await store.queue.enqueue(session.keys, [extra])
    await store.queue.end_sessions(
        UserKeys(session.keys.tenant, "u"), [session.keys.session_id], END
    )
    assert order(admin, session.keys) == hashed(admin, session.keys)
    assert order(admin, session.keys)[:2] == [END.id, "fold:1-2:t1"]  # the end sorts first
    assert admin.ttl(session.keys.job_order) > 0

    runner = JobRunner(store, Summarizer(None, TokenCounter()), ROLLING)
    assert await runner.run(session.keys, session.jobs[0]) == "written"  # write_tiers.lua
    await store.queue.finish_job(session.keys, extra)
    assert order(admin, session.keys) == hashed(admin, session.keys) == [END.id, *[
        job.id for job in session.jobs[1:]
    ]]  # fmt: skip

    await store.sessions.erase_session(session.keys)
    assert not admin.exists(session.keys.job_order)


async def test_a_failed_attempt_backs_off_doubling_to_its_cap_then_the_job_is_dropped(
    store: RedisStore, admin: Any
) -> None:
    session = Turns(store, ROLLING, keys_of("fails"))
    [job] = await session.add()

    async def fail(now: float) -> Any:
        return await store.queue.fail_job(
            session.keys, job.id, allowed=4, now=now, backoff_s=2.0, most_s=5.0
        )

    first, second, third = await fail(100.0), await fail(200.0), await fail(300.0)
    assert (first.attempts, first.retry_at, first.dropped) == (1, 102.0, False)
    assert (second.attempts, second.retry_at) == (2, 204.0)
    assert (third.attempts, third.retry_at) == (3, 305.0)  # 8 s, at most 5
    head = await store.queue.job_head(session.keys, job.id)
    assert head.own is not None and head.own.job == job  # the job itself unchanged
    assert (head.own.attempts, head.own.retry_at) == (3, 305.0)

    last = await fail(400.0)
    assert last.dropped and last.attempts == 4
    assert admin.hlen(session.keys.jobs) == 0 and order(admin, session.keys) == []
    assert (await fail(500.0)).attempts == 0  # no longer pending: nothing written back
    assert admin.hlen(session.keys.jobs) == 0


async def test_the_head_is_read_again_from_the_hash_when_the_order_disagrees(
    store: RedisStore, admin: Any
) -> None:
    session = Turns(store, ROLLING, keys_of("rebuilt"))
    for _ in range(3):
        await session.add()
    first, _, newest = session.jobs

    admin.delete(session.keys.job_order)  # an older gateway's jobs: the hash alone
    head = await store.queue.job_head(session.keys, newest.id)
    assert head.own is not None and head.own.job == newest and head.count == 3
    assert head.oldest is not None and head.oldest.job == first
    assert order(admin, session.keys) == hashed(admin, session.keys)

    admin.hdel(session.keys.jobs, first.id)  # an id left behind in the order
    admin.hset(session.keys.jobs, "chunk:1-1:t0", json.dumps(Job("chunk", 1, 1, 50).to_data()))
    head = await store.queue.job_head(session.keys, newest.id)
    assert head.oldest is not None and head.oldest.job == session.jobs[1]
    assert order(admin, session.keys) == hashed(admin, session.keys)
