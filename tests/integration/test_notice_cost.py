"""A notice costs the worker the same however many jobs its session has pending: the
Redis commands it sends and the bytes of the replies it parses are counted at the
store's link, for a session with a few jobs pending and one with a hundred times more.

(It read and parsed every pending job of the session twice: once to find the notice's
own, once more under the lease.)"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from devsupport.servers import RedisProcess
from gateway.presets import PRESETS
from gateway.service.worker import JobRunner
from gateway.store.keys import SessionKeys, job_stream
from gateway.store.link import Command, RedisLink
from gateway.store.redis_store import JobNotice, RedisStore, create_client
from gateway.summarize.summarizer import Summarizer
from gateway.text.tokens import TokenCounter
from tests.support.recorded_turns import Turns

ROLLING = PRESETS["rolling-summary"]  # one job every turn


def reply_bytes(reply: Any) -> int:
    """The bytes of a reply the caller reads (strings and bulk strings, nested)."""
    if isinstance(reply, bytes | str):
        return len(reply)
    if isinstance(reply, list | tuple):
        return sum(reply_bytes(part) for part in reply)
    return 0


class MeteredLink(RedisLink):
    """A store's link that counts the commands it sends and the bytes that come back."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.commands = 0
        self.bytes = 0

    async def execute(
        self, commands: Sequence[Command], *, deadline: float | None, op: str
    ) -> list[Any]:
        replies = await super().execute(commands, deadline=deadline, op=op)
        self.commands += len(commands)
        self.bytes += reply_bytes(replies)
        return replies


@dataclass
class Metered:
    store: RedisStore
    link: MeteredLink

    def cost(self) -> tuple[int, int]:
        return self.link.commands, self.link.bytes


@pytest.fixture
async def metered(private_redis: RedisProcess, admin: Any) -> AsyncIterator[Metered]:
    client = create_client(private_redis.url, timeout_s=2, max_connections=4)
    link = MeteredLink(client)
    store = RedisStore(client, timeout_s=2, retention_s=3600, job_shards=1, link=link)
    yield Metered(store, link)
    await store.close()


async def session_with(store: RedisStore, name: str, turns: int) -> Turns:
    session = Turns(store, ROLLING, SessionKeys("t", name))
    for _ in range(turns):
        await session.add()
    return session


def notice_of(admin: Any, session: Turns, index: int) -> JobNotice:
    job = session.jobs[index]
    for entry, fields in admin.xrange(job_stream(0)):
        if fields[b"job"] == job.id.encode() and fields[b"sid"] == session.keys.session_id.encode():
            return JobNotice(entry, session.keys, job.id)
    raise AssertionError(f"no notice of {job.id}")


async def cost_of(metered: Metered, runner: JobRunner, notice: JobNotice) -> tuple[int, int]:
    before = metered.cost()
    await runner.run_notice(notice)
    after = metered.cost()
    return after[0] - before[0], after[1] - before[1]


async def test_a_notice_costs_the_same_with_5_or_500_jobs_pending(
    metered: Metered, admin: Any
) -> None:
    few = await session_with(metered.store, "few", 5)
    many = await session_with(metered.store, "many", 500)
    runner = JobRunner(metered.store, Summarizer(None, TokenCounter()), ROLLING, attempts=3)
    assert admin.hlen(many.keys.jobs) == 100 * admin.hlen(few.keys.jobs)

    # The oldest job's notice: it runs its job, the others wait.
    first = [await cost_of(metered, runner, notice_of(admin, s, 0)) for s in (few, many)]
    # The same notice again (delivered twice): its job is done, nothing to run.
    again = [await cost_of(metered, runner, notice_of(admin, s, 0)) for s in (few, many)]

    assert first[0] == first[1], first  # commands and reply bytes: the same
    assert again[0] == again[1], again
    assert admin.hlen(many.keys.jobs) == 499
