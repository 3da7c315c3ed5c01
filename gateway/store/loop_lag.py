"""How late this process's event loop runs what is due: time a Redis deadline must not count.

The Redis deadline (``redis.timeout_ms``) bounds how long a request waits for Redis. Under
load a reply can arrive in time and still wait in the event loop's queue behind other
requests' work; counted against the deadline, that queueing degraded requests (memory
dropped) while Redis sat idle: 83 of the streams in a 256-stream hold, at 100 ms. The
watcher measures the loop's lateness, and a store call's deadline is extended by it, up
to ``MAX_S``. On an idle loop the lag is about zero and the deadline is what it says.
"""

from __future__ import annotations

import asyncio


class LoopLag:
    INTERVAL_S = 0.02
    MAX_S = 1.0
    # Rise at once, fall over a few ticks: the calls queued behind a burst still wait.
    DECAY = 0.8

    def __init__(self) -> None:
        self.seconds = 0.0

    def observe(self, late_s: float) -> None:
        self.seconds = min(self.MAX_S, max(late_s, self.seconds * self.DECAY))

    async def watch(self) -> None:
        """Sleep a tick at a time and record how late each wake-up came (until cancelled)."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.INTERVAL_S
            await asyncio.sleep(self.INTERVAL_S)
            self.observe(max(0.0, loop.time() - due))
