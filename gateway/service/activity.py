"""Requests first: the in-process worker starts a job when the event loop has no turn to
serve, and only every so often while it always has one.

A turn's CPU work (preparing its context, recording it) and a summarization job's
(parsing the summarizer's answer, the model-free fallback, writing the tiers) share one
event loop in ``serve``. A job started between two turns delays the second by what it
runs before its first await: in a closed loop of requests at one a time, jobs that
started whenever they were read added ~1.3 ms to the median turn of a gateway whose
summarizer's answers were refused (``bench/overhead.py``, sessions section). Started
only when no turn has been worked on for ``QUIET_S`` (while a turn waits for the
upstream's answer, between a user's turns), they run in the loop's idle time; under
unbroken load, one starts after waiting ``max_wait_s``, so the backlog still drains at
a known rate (``/metrics`` shows it: past that rate, run ``memory-gateway worker``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

# How long the loop must have had no turn's work in hand before a job may start: longer
# than the gap between two requests of a client sending one after another (~0.3 ms
# here), shorter than a turn's wait for its model's first token.
QUIET_S = 0.002


class Activity:
    """How busy the event loop is with turns: how many are being worked on now (their
    context prepared, their exchange recorded) and when the last one stopped."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._busy = 0
        self._since = clock()  # when the count last fell to 0
        self._claimed = -float("inf")  # when a quiet stretch was last given to a job
        # Made for the loop that waits on them (``_waits``): an app started again on
        # another loop (a test's second client) gets new ones, not a RuntimeError.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: asyncio.Event | None = None
        # Jobs start one at a time: under unbroken load, one per ``max_wait_s``, not all
        # of the worker's slots at once when their waits end together.
        self._turn: asyncio.Lock | None = None

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """Around a turn's CPU-bound step."""
        self._busy += 1
        if self._idle is not None:
            self._idle.clear()
        try:
            yield
        finally:
            self._busy -= 1
            if not self._busy:
                self._since = self.clock()
                if self._idle is not None:
                    self._idle.set()

    def _waits(self) -> tuple[asyncio.Event, asyncio.Lock]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._idle is None or self._turn is None:
            self._loop, self._idle, self._turn = loop, asyncio.Event(), asyncio.Lock()
            if not self._busy:
                self._idle.set()
        return self._idle, self._turn

    async def quiet(self, max_wait_s: float) -> bool:
        """Return once no turn has been worked on for ``QUIET_S`` (True), or after
        ``max_wait_s`` whatever the load (False); one caller at a time."""
        idle, turn = self._waits()
        async with turn:
            return await self._quiet(idle, max_wait_s)

    async def _quiet(self, idle: asyncio.Event, max_wait_s: float) -> bool:
        deadline = self.clock() + max_wait_s
        while True:
            left = deadline - self.clock()
            if left <= 0:
                return False
            if self._busy:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(idle.wait(), left)
                continue
            # Each job its own quiet stretch: the jobs that waited behind one do not all
            # start in the gap it found.
            now = self.clock()
            still = QUIET_S - (now - max(self._since, self._claimed))
            if still <= 0:
                self._claimed = now
                return True
            await asyncio.sleep(min(still, left))
