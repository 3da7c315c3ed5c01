"""LoopLag: the event loop's lateness, which a Redis deadline must not count."""

from __future__ import annotations

import asyncio
import time

from gateway.store.loop_lag import LoopLag


def test_lag_rises_at_once_and_falls_over_a_few_ticks() -> None:
    lag = LoopLag()
    lag.observe(0.3)
    assert lag.seconds == 0.3
    lag.observe(0.0)
    assert lag.seconds == 0.3 * LoopLag.DECAY
    for _ in range(40):
        lag.observe(0.0)
    assert lag.seconds < 0.001


def test_lag_is_capped() -> None:
    lag = LoopLag()
    lag.observe(30.0)
    assert lag.seconds == LoopLag.MAX_S


async def test_a_blocked_loop_is_seen_late() -> None:
    lag = LoopLag()
    watcher = asyncio.create_task(lag.watch())
    await asyncio.sleep(LoopLag.INTERVAL_S * 3)
    quiet = lag.seconds
    time.sleep(0.25)  # noqa: ASYNC251 (on purpose: a burst of request work holding the loop)
    await asyncio.sleep(LoopLag.INTERVAL_S * 2)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    assert quiet < 0.2
    assert lag.seconds > 0.15
