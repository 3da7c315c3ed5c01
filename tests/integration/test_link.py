"""The request path's one link to Redis (gateway/store/link.py) and its one deadline: how
long Redis may stay silent on the call's connection. A silent Redis is a real one told
to hold every client's replies (``CLIENT PAUSE``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from devsupport.servers import RedisProcess
from gateway.store.calls import StoreCalls, StoreUnavailable, create_client
from gateway.store.keys import SessionKeys
from gateway.store.link import RedisLink
from gateway.store.parsed_messages import ParsedMessages
from gateway.store.sessions import Sessions
from gateway.store.tiers_cache import TiersCache
from gateway.store.users import Users
from tests.support.waiting import until


@pytest.fixture
async def calls(redis_server: RedisProcess) -> AsyncIterator[StoreCalls]:
    """The store's calls (private to the store's parts), under a 50 ms deadline."""
    opened = StoreCalls(
        create_client(redis_server.url, timeout_s=2, max_connections=2),
        timeout_s=0.05,
        retention_s=3600,
    )
    await opened.warm(timeout_s=2)
    yield opened
    await opened.close()


@pytest.fixture
def link(calls: StoreCalls) -> RedisLink:
    return calls.link


@pytest.fixture
def sessions(calls: StoreCalls) -> Sessions:
    return Sessions(calls, Users(calls), TiersCache(), ParsedMessages())


@pytest.fixture
def pause(redis_server: RedisProcess) -> Iterator[Callable[[int], None]]:
    """``pause(ms)``: Redis holds every normal client's replies that long."""
    admin = redis_server.client()

    def paused(ms: int) -> None:
        admin.client_pause(ms, all=True)

    yield paused
    admin.client_unpause()
    admin.close()


async def test_a_call_on_a_silent_redis_times_out_at_its_deadline(
    link: RedisLink, pause: Callable[[int], None]
) -> None:
    pause(1000)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        await link.execute([("PING",)], deadline=0.05, op="test")
    assert 0.05 <= loop.time() - start < 0.3  # an idle loop: exactly what it says


async def test_the_store_reports_a_silent_redis_as_unavailable_in_its_deadline(
    sessions: Sessions, pause: Callable[[int], None]
) -> None:
    pause(1000)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(StoreUnavailable, match="TimeoutError"):
        await sessions.messages_at(SessionKeys("t", "silent"), [1, 2])
    assert loop.time() - start < 0.3


async def test_a_reply_that_came_while_the_loop_was_busy_is_taken(link: RedisLink) -> None:
    await link.execute([("PING",)], deadline=1, op="test")
    call = asyncio.ensure_future(link.execute([("PING",)], deadline=0.05, op="test"))
    await asyncio.sleep(0)  # queued for this loop turn's write
    await asyncio.sleep(0)  # written, its deadline set
    time.sleep(0.2)  # noqa: ASYNC251 (on purpose: other requests' work holds the loop)
    assert await call == [b"PONG"]  # Redis answered at once: the loop was late, not Redis


async def test_a_loop_that_stays_behind_does_not_extend_a_silent_redis_for_long(
    link: RedisLink, pause: Callable[[int], None]
) -> None:
    await link.execute([("PING",)], deadline=1, op="test")

    async def hog() -> None:
        while True:
            await asyncio.sleep(0)
            time.sleep(0.02)  # noqa: ASYNC251 (a loop that stays behind)

    hogging = asyncio.create_task(hog())
    pause(2000)
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        with pytest.raises(TimeoutError):
            await link.execute([("PING",)], deadline=0.05, op="test")
    finally:
        hogging.cancel()
        await asyncio.gather(hogging, return_exceptions=True)
    assert loop.time() - start < 0.6


async def test_a_cancellation_from_elsewhere_is_not_turned_into_a_timeout(
    link: RedisLink, pause: Callable[[int], None]
) -> None:
    # A client that left cancels the request's task: that must stay a cancellation.
    await link.execute([("PING",)], deadline=1, op="test")
    pause(500)
    task = asyncio.create_task(link.execute([("PING",)], deadline=5, op="test"))
    connections: Any = link._connections  # (its links' queues: calls waiting on a reply)
    await until(lambda: any(c.queue for c in connections._links), 2, "the call under way")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_deadline_that_expired_leaves_no_cancellation_behind(
    link: RedisLink, pause: Callable[[int], None]
) -> None:
    await link.execute([("PING",)], deadline=1, op="test")
    pause(300)
    with pytest.raises(TimeoutError):
        await link.execute([("PING",)], deadline=0.01, op="test")
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)  # the task goes on normally


async def test_a_call_that_answers_in_time_leaves_no_timer(link: RedisLink) -> None:
    assert await link.execute([("PING",)], deadline=0.05, op="test") == [b"PONG"]
    await asyncio.sleep(0.1)  # past the deadline: nothing fires into this task
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    assert await link.execute([("ECHO", "still")], deadline=0.05, op="test") == [b"still"]


async def test_an_emptied_script_cache_is_loaded_again_and_the_call_sent_again(
    sessions: Sessions, redis_server: RedisProcess
) -> None:
    keys = SessionKeys("t", f"flushed-{time.time_ns()}")
    admin = redis_server.client()
    try:
        admin.hset(keys.meta, "created", "1")
        admin.script_flush()
    finally:
        admin.close()
    assert await sessions.end_session(keys, now=2.0) is True  # NOSCRIPT, loaded, sent again
    assert (await sessions.meta(keys))["ended"] == "2.0"


async def test_an_error_reply_raises_only_among_the_commands_needed(calls: StoreCalls) -> None:
    commands = [("PING",), ("NOSUCHCOMMAND",)]
    replies = await calls.execute(commands, op="test", needed=1)
    assert replies[0] == b"PONG" and isinstance(replies[1], Exception)
    with pytest.raises(StoreUnavailable, match="unknown command"):
        await calls.execute(commands, op="test")
