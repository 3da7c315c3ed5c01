"""CPU-heavy work on a large input, in a worker thread instead of on the event loop.

Every request shares the event loop: a 4 MiB message tokenized on it held every other
tenant's requests for seconds. Work whose cost grows with a request's size
(parsing a large body, counting a long message's tokens, indexing it for recall) runs
here when its input is at least ``HEAVY_CHARS`` long; below that it runs inline, where
it costs less than the ~50-100 µs of a hop to a thread and back.

The threads are a small pool of their own, not the default executor: heavy inputs queue
for at most ``WORKERS`` threads, so however many large bodies arrive at once they take
at most that many cores, and the event loop keeps one. tiktoken's encoding (the bulk of
the cost) runs without the GIL; what holds it (JSON parsing, stemming) is cut into
pieces by its callers, so the loop gets the GIL back between pieces.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# Characters (or bytes) of input from which work leaves the loop: tokenizing this much
# English takes about a millisecond, random letters several.
HEAVY_CHARS = 32 * 1024


def _workers() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 2
    return max(1, cores // 2)


WORKERS = _workers()
_pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="gateway-heavy")


async def off_loop(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``function(*args, **kwargs)`` in the heavy-work pool.

    A cancelled caller stops waiting, but the thread finishes the call (a thread cannot
    be interrupted): its cost is bounded by the caps on a message's size.
    """
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool, functools.partial(function, *args, **kwargs))


async def sized(size: int, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``function(*args, **kwargs)`` inline when ``size`` (its input's length) is below
    ``HEAVY_CHARS``, in the heavy-work pool otherwise."""
    if size < HEAVY_CHARS:
        return function(*args, **kwargs)
    return await off_loop(function, *args, **kwargs)
