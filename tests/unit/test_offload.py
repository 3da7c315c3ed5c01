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


def _queued(owner: str, count: int, ran: list[str], gate: threading.Event) -> list[object]:
    """``count`` heavy jobs of ``owner`` (each records it ran, the first waits on ``gate``)."""

    def job(n: int) -> None:
        if n == 0:
            gate.wait(10)
        ran.append(owner)

    async def one(n: int) -> None:
        offload.work_for(owner)  # each task has its own context, as each request has
        await offload.off_loop(job, n)

    return [one(n) for n in range(count)]


def test_each_owner_is_served_in_turn_not_in_order_of_arrival() -> None:
    async def main() -> list[str]:
        ran: list[str] = []
        gate = threading.Event()
        queues = offload.FairQueues(asyncio.get_running_loop(), workers=1)
        offload._queues[asyncio.get_running_loop()] = queues
        # A tenant's five jobs arrive first (the first holds the thread), then another's.
        greedy = [asyncio.ensure_future(c) for c in _queued("greedy", 5, ran, gate)]
        await asyncio.sleep(0)
        other = [asyncio.ensure_future(c) for c in _queued("other", 1, ran, gate)]
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(*greedy, *other)
        return ran

    ran = asyncio.run(main())
    # The other tenant's job waits for the running one and one more of the greedy
    # tenant's (queued before it came), not for all five.
    assert ran == ["greedy", "greedy", "other", "greedy", "greedy", "greedy"]


def test_work_whose_caller_left_before_its_turn_is_not_run() -> None:
    async def main() -> list[int]:
        ran: list[int] = []
        gate = threading.Event()
        offload._queues[asyncio.get_running_loop()] = offload.FairQueues(
            asyncio.get_running_loop(), workers=1
        )
        first = asyncio.ensure_future(offload.off_loop(lambda: (gate.wait(10), ran.append(1))))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(offload.off_loop(ran.append, 2))
        await asyncio.sleep(0)
        second.cancel()
        gate.set()
        await first
        third = await offload.off_loop(ran.append, 3)  # the thread is free again
        assert third is None
        return ran

    assert asyncio.run(main()) == [1, 3]


def test_an_error_in_heavy_work_reaches_its_caller() -> None:
    async def main() -> None:
        await offload.off_loop(int, "not a number")

    try:
        asyncio.run(main())
    except ValueError as error:
        assert "not a number" in str(error)
    else:
        raise AssertionError("the error was lost")
