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

The pool is shared fairly: heavy work waits in a queue of its owner's (the tenant whose
request it serves: ``work_for``, set when a request's caller is identified), and a free
thread takes the next job from each owner's queue in turn. One tenant sending large
bodies in a loop would otherwise queue ahead of every other tenant's large request (a
40 KB one waited 47 s behind one 3.4 MB body of image text chunks); now it waits for at
most one job of each other owner. Work whose caller left before its turn is not run.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

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


# Whose request the current context's heavy work serves ("": nobody's in particular).
_owner: ContextVar[str] = ContextVar("memory_gateway_heavy_owner", default="")


def work_for(owner: str) -> None:
    """The current request's heavy work is ``owner``'s (its tenant: a key's hash, never
    a key)."""
    _owner.set(owner)


_Job = tuple[Callable[[], Any], "asyncio.Future[Any]"]


class FairQueues:
    """One event loop's heavy work: a queue per owner, served in turn by ``WORKERS``
    threads of the shared pool."""

    def __init__(self, loop: asyncio.AbstractEventLoop, workers: int) -> None:
        self.loop = loop
        self.free = workers
        # Owners with work waiting, in the order they are served (a dict keeps it).
        self.queues: dict[str, collections.deque[_Job]] = {}

    async def run(self, owner: str, call: Callable[[], T]) -> T:
        future: asyncio.Future[T] = self.loop.create_future()
        self.queues.setdefault(owner, collections.deque()).append((call, future))
        self._dispatch()
        return await future  # cancelled: the job is skipped if it has not started

    def _dispatch(self) -> None:
        while self.free and self.queues:
            owner = next(iter(self.queues))
            queue = self.queues.pop(owner)
            call, future = queue.popleft()
            if queue:
                self.queues[owner] = queue  # the rest of it goes to the back of the line
            if future.done():
                continue  # its caller stopped waiting
            self.free -= 1
            running = self.loop.run_in_executor(_pool, call)
            running.add_done_callback(functools.partial(self._finished, future))

    def _finished(self, future: asyncio.Future[Any], running: asyncio.Future[Any]) -> None:
        self.free += 1
        if not future.done():
            if running.cancelled():
                future.cancel()
            elif (error := running.exception()) is not None:
                future.set_exception(error)
            else:
                future.set_result(running.result())
        self._dispatch()


# Per event loop (a process serves on one; tests run gateways on several): the threads
# are the one pool's, so every loop together still uses at most WORKERS of them.
_queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FairQueues] = (
    weakref.WeakKeyDictionary()
)


async def off_loop(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``function(*args, **kwargs)`` in the heavy-work pool, in its owner's turn.

    A cancelled caller stops waiting, but a thread that began the call finishes it (a
    thread cannot be interrupted): its cost is bounded by the caps on a message's size.
    """
    loop = asyncio.get_running_loop()
    queues = _queues.get(loop)
    if queues is None:
        queues = _queues[loop] = FairQueues(loop, WORKERS)
    return await queues.run(_owner.get(), functools.partial(function, *args, **kwargs))


async def sized(size: int, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``function(*args, **kwargs)`` inline when ``size`` (its input's length) is below
    ``HEAVY_CHARS``, in the heavy-work pool otherwise."""
    if size < HEAVY_CHARS:
        return function(*args, **kwargs)
    return await off_loop(function, *args, **kwargs)
