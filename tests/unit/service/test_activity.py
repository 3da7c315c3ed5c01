"""The in-process worker gives way to turns (``activity.Activity``): a job starts once no
turn has been worked on for ``QUIET_S``, or after its longest wait under unbroken load,
and jobs waiting together each get a quiet stretch of their own."""

from __future__ import annotations

import asyncio
import itertools

from gateway.service.activity import QUIET_S, Activity


async def test_a_job_starts_only_a_quiet_stretch_after_the_last_turn() -> None:
    activity = Activity()
    loop = asyncio.get_running_loop()
    with activity.working():
        waiting = asyncio.ensure_future(activity.quiet(5.0))
        await asyncio.sleep(0.05)  # the turn's work, however long it takes
        assert not waiting.done()
    ended = loop.time()
    assert await waiting is True
    assert loop.time() - ended >= QUIET_S * 0.99


async def test_a_turn_that_starts_during_the_stretch_postpones_the_job() -> None:
    activity = Activity()
    with activity.working():
        pass
    waiting = asyncio.ensure_future(activity.quiet(5.0))
    with activity.working():
        await asyncio.sleep(QUIET_S * 3)  # longer than the stretch the job waited for
        assert not waiting.done()
    assert await waiting is True


async def test_under_unbroken_turns_a_job_starts_after_its_longest_wait() -> None:
    activity = Activity()
    loop = asyncio.get_running_loop()
    with activity.working():
        started = loop.time()
        assert await activity.quiet(0.05) is False
        assert loop.time() - started >= 0.05 * 0.99


async def test_jobs_waiting_together_each_get_a_quiet_stretch_of_their_own() -> None:
    activity = Activity()
    loop = asyncio.get_running_loop()
    started: list[float] = []

    async def job() -> None:
        assert await activity.quiet(5.0) is True
        started.append(loop.time())

    await asyncio.gather(job(), job(), job())
    gaps = [later - earlier for earlier, later in itertools.pairwise(started)]
    assert len(gaps) == 2 and min(gaps) >= QUIET_S * 0.99


def test_one_activity_serves_an_app_started_again_on_another_loop() -> None:
    """A waiter bound to the first loop's primitives would fail on the second (a job
    dropped as an error); each loop gets its own."""
    activity = Activity()

    async def busy_then_quiet() -> bool:
        with activity.working():
            waiting = asyncio.ensure_future(activity.quiet(5.0))
            await asyncio.sleep(0.01)
        return await waiting

    assert asyncio.run(busy_then_quiet()) is True
    assert asyncio.run(busy_then_quiet()) is True
