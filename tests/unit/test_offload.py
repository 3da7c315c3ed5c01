"""Heavy work leaves the event loop by the size of its input (issue 22)."""

from __future__ import annotations

import asyncio
import threading

from gateway import offload


def _where() -> str:
    return threading.current_thread().name


def test_small_inputs_run_inline_and_large_ones_in_the_heavy_pool() -> None:
    async def main() -> tuple[str, str, str]:
        small = await offload.sized(offload.HEAVY_CHARS - 1, _where)
        large = await offload.sized(offload.HEAVY_CHARS, _where)
        return small, large, _where()

    small, large, loop_thread = asyncio.run(main())
    assert small == loop_thread
    assert large != loop_thread and large.startswith("gateway-heavy")


def test_the_loop_runs_while_heavy_work_waits() -> None:
    """The pool's thread blocks until the loop has run a task: inline, it would deadlock."""

    async def main() -> bool:
        ran = threading.Event()

        async def on_loop() -> None:
            ran.set()

        task = asyncio.ensure_future(on_loop())
        done = await offload.off_loop(ran.wait, 10)
        await task
        return done

    assert asyncio.run(main()) is True


def test_the_pool_takes_at_most_half_the_cores() -> None:
    assert offload.WORKERS >= 1
    assert offload._pool._max_workers == offload.WORKERS
