"""A Redis deadline that does not count the event loop's own lateness.

For the store's calls through redis-py (the memory API, the catalog, start-up): the
request path's load and record keep their deadline in ``connections``, which knows when
Redis last answered and so needs no guess from the loop's lateness.

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
from types import TracebackType

# Lateness below this is ordinary timer jitter, not a loop that is behind.
MIN_LATE_S = 0.005
MAX_EXTRA_S = 1.0


class lag_tolerant_timeout:  # lower case: used like asyncio.timeout
    """Like ``asyncio.timeout(timeout_s)``, extended by the time the loop ran late.

    A class rather than a generator around ``asyncio.timeout``: it runs twice on every
    request (load and record), where the generator, the inner timeout and its own timer
    were ~3% of a memory request's CPU. It cancels its task and turns that cancellation
    into ``TimeoutError`` the way ``asyncio.timeout`` does (``Task.uncancel``), so that a
    cancellation from elsewhere (a client that left, a shutdown) still propagates.
    """

    __slots__ = (
        "_cancelling",
        "_expired",
        "_extra",
        "_handle",
        "_loop",
        "_max_extra",
        "_task",
        "_timeout_s",
    )

    def __init__(self, timeout_s: float, *, max_extra_s: float = MAX_EXTRA_S) -> None:
        self._timeout_s = timeout_s
        self._max_extra = max_extra_s
        self._extra = 0.0
        self._expired = False
        self._handle: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("lag_tolerant_timeout must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._loop = loop = asyncio.get_running_loop()
        due = loop.time() + self._timeout_s
        self._handle = loop.call_at(due, self._fire, due)

    def _fire(self, due: float) -> None:
        now = self._loop.time()
        late = now - due
        if late >= MIN_LATE_S and self._extra + late <= self._max_extra:
            # Late: the loop was behind, and a reply may be waiting in its queue.
            self._extra += late
            self._handle = self._loop.call_at(now + late, self._fire, now + late)
        else:
            self._handle = None
            self._expired = True
            self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if (
            self._expired
            and self._task.uncancel() <= self._cancelling
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError from exc
