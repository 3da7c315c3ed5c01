"""A Redis deadline that does not count the event loop's own lateness.

The Redis deadline (``redis.timeout_ms``) bounds how long a request waits for Redis. Under
load a reply arrives in time and then waits in the event loop's queue behind other
requests' work; counted against the deadline, that queueing degraded requests (memory
dropped) while Redis sat idle: 170 of 2,209 streams in a 256-stream hold at 100 ms.

So the deadline's timer checks how late it fired itself. Late by ``late`` means the loop
was that far behind, and a reply may be sitting in its queue: the call gets ``late``
more, again and again while the loop stays behind, up to ``max_extra_s`` in all. On time
means the loop was free and Redis really did not answer: the call is cancelled. An idle
loop's deadline is therefore exactly what it says (a black-holed Redis still degrades a
request in ``timeout_ms``); an overloaded one's is at most ``max_extra_s`` longer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

# Lateness below this is ordinary timer jitter, not a loop that is behind.
MIN_LATE_S = 0.005
MAX_EXTRA_S = 1.0


@asynccontextmanager
async def lag_tolerant_timeout(
    timeout_s: float, *, max_extra_s: float = MAX_EXTRA_S
) -> AsyncIterator[None]:
    """Like ``asyncio.timeout(timeout_s)``, extended by the time the loop ran late."""
    loop = asyncio.get_running_loop()
    extra = 0.0
    handle: asyncio.TimerHandle | None = None

    async with asyncio.timeout(None) as timeout:

        def expire(due: float) -> None:
            nonlocal extra, handle
            late = loop.time() - due
            if late >= MIN_LATE_S and extra + late <= max_extra_s:
                extra += late
                handle = loop.call_at(loop.time() + late, expire, loop.time() + late)
            else:
                timeout.reschedule(loop.time())

        due = loop.time() + timeout_s
        handle = loop.call_at(due, expire, due)
        try:
            yield
        finally:
            if handle is not None:
                handle.cancel()
