"""A stopping worker cancels its blocked read of the job stream at once, on a real Redis,
and leaves nothing behind: no reply half-read on a pooled connection, no notice handed to
a read that is gone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devsupport.servers import RedisProcess
from gateway.presets import PRESETS
from gateway.service.worker import JobRunner, Worker
from gateway.store.keys import JOB_GROUP, job_stream
from gateway.store.redis_store import RedisStore, create_client
from gateway.summarize.summarizer import Summarizer
from gateway.text.tokens import TokenCounter

SHARDS = 4


async def open_store(url: str, *, connections: int, shards: int = SHARDS) -> RedisStore:
    client = create_client(url, timeout_s=2, max_connections=connections)
    return RedisStore(client, timeout_s=2, retention_s=3600, job_shards=shards)


@pytest.fixture
async def store(private_redis: RedisProcess) -> AsyncIterator[RedisStore]:
    opened = await open_store(private_redis.url, connections=SHARDS * 2)
    yield opened
    await opened.close()


def blocked_reads(admin: Any) -> int:
    """Clients the server holds blocked in XREADGROUP."""
    return sum(1 for c in admin.client_list() if c["cmd"] == "xreadgroup" and "b" in c["flags"])


async def until(condition: Any, what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def announce(admin: Any, shard: int, job_id: str) -> None:
    admin.xadd(job_stream(shard), {"tenant": "t", "sid": "s", "job": job_id})


def pending(admin: Any, shard: int) -> int:
    return int(admin.xpending(job_stream(shard), JOB_GROUP)["pending"])


async def test_a_worker_blocked_for_five_seconds_stops_without_waiting_it_out(
    store: RedisStore, admin: Any
) -> None:
    runner = JobRunner(store, Summarizer(None, TokenCounter()), PRESETS["hybrid"])
    worker = Worker(store.queue, runner, block_ms=5000, consumer="stopping")
    stop = asyncio.Event()
    running = asyncio.ensure_future(worker.run(stop))
    await until(lambda: blocked_reads(admin) == SHARDS, "the worker's reads never blocked")

    started = time.monotonic()
    stop.set()
    await asyncio.wait_for(running, 5)
    elapsed = time.monotonic() - started
    # ~0.05 s when the read is cancelled; a stop that waited the 5 s block out fails. The
    # bar is half the block, not a timing target: a loaded CI machine adds its own pauses.
    assert elapsed < 2.5, f"stopped in {elapsed:.2f} s"
    # The server let go of the reads (their connections were closed), so a notice
    # announced now waits for the next worker instead of going to one that left.
    # (Well within the reads' 5 s block, which would also end them.)
    await until(lambda: blocked_reads(admin) == 0, "a cancelled read is still blocked", 2.0)
    for shard in range(SHARDS):
        announce(admin, shard, f"after-stop-{shard}")
    assert [pending(admin, shard) for shard in range(SHARDS)] == [0] * SHARDS
    for shard in range(SHARDS):
        taken = await store.queue.read_jobs(shard, "next", count=10, block_ms=100)
        assert [n.job_id for n in taken] == [f"after-stop-{shard}"]


async def test_a_cancelled_blocked_read_leaves_no_reply_for_the_next_command(
    private_redis: RedisProcess, admin: Any
) -> None:
    """One pooled connection: the command after the cancelled read runs on it. Had the
    connection been kept open with the read still blocked, the notice announced next would
    be handed to the cancelled read and its reply read as the next command's."""
    store = await open_store(private_redis.url, connections=1, shards=1)
    try:
        await store.queue.ensure_group(0)
        read = asyncio.ensure_future(store.queue.read_jobs(0, "gone", count=1, block_ms=5000))
        await until(lambda: blocked_reads(admin) == 1, "the read never blocked")
        read.cancel()
        await asyncio.gather(read, return_exceptions=True)
        assert read.cancelled()
        await until(lambda: blocked_reads(admin) == 0, "the cancelled read is still blocked", 2.0)

        announce(admin, 0, "job-after-cancel")
        assert await store.client.echo("mine") == b"mine"
        assert await store.client.get("absent") is None
        taken = await store.queue.read_jobs(0, "next", count=10, block_ms=100)
        assert [n.job_id for n in taken] == ["job-after-cancel"]
        consumers = admin.xinfo_consumers(job_stream(0), JOB_GROUP)
        held = {c["name"].decode(): c["pending"] for c in consumers}
        assert held.get("gone", 0) == 0 and held["next"] == 1
    finally:
        await store.close()
