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
