"""lag_tolerant_timeout: a deadline that does not count the event loop's lateness."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.store.loop_lag import lag_tolerant_timeout


async def test_a_call_that_does_not_answer_times_out_on_an_idle_loop() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        async with lag_tolerant_timeout(0.05):
            await asyncio.Event().wait()  # Redis black-holed
    assert 0.05 <= loop.time() - start < 0.5


async def test_a_reply_queued_behind_a_busy_loop_is_still_taken() -> None:
    reply: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def burst_then_reply() -> None:
        await asyncio.sleep(0.01)
        time.sleep(0.2)  # noqa: ASYNC251 (on purpose: other requests' work holds the loop)
        reply.set_result("ok")  # the reply was there in time; the loop was not

    other = asyncio.create_task(burst_then_reply())
    async with lag_tolerant_timeout(0.05):
        assert await reply == "ok"
    await other


async def test_a_plain_timeout_drops_the_same_reply() -> None:
    # The behaviour this replaces: the loop's lateness counted against Redis.
    reply: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def burst() -> None:
        await asyncio.sleep(0.01)
        time.sleep(0.2)  # noqa: ASYNC251

    other = asyncio.create_task(burst())
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, reply.set_result, "ok")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await reply
    await other


async def test_the_extension_is_capped() -> None:
    async def hog() -> None:
        while True:
            await asyncio.sleep(0)
            time.sleep(0.02)  # noqa: ASYNC251 (a loop that stays behind)

    hogging = asyncio.create_task(hog())
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        async with lag_tolerant_timeout(0.05, max_extra_s=0.2):
            await asyncio.Event().wait()
    hogging.cancel()
    await asyncio.gather(hogging, return_exceptions=True)
    assert loop.time() - start < 0.6


async def test_a_cancellation_from_elsewhere_is_not_turned_into_a_timeout() -> None:
    # A client that left cancels the request's task: that must stay a cancellation.
    async def call() -> None:
        async with lag_tolerant_timeout(5):
            await asyncio.Event().wait()

    task = asyncio.create_task(call())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_deadline_that_expired_leaves_no_cancellation_behind() -> None:
    with pytest.raises(TimeoutError):
        async with lag_tolerant_timeout(0.01):
            await asyncio.Event().wait()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)  # the task goes on normally


async def test_a_call_that_answers_in_time_leaves_no_timer() -> None:
    deadline = lag_tolerant_timeout(0.05)
    async with deadline:
        await asyncio.sleep(0)
    await asyncio.sleep(0.1)  # past the deadline: nothing fires into this task
