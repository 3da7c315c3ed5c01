"""Many things at once: work released together on threads by a barrier."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def all_at_once(n: int, work: Any) -> list[Any]:
    """Run ``work(i)`` for i < n on n threads released together by a barrier."""
    barrier = threading.Barrier(n)

    def run(i: int) -> Any:
        barrier.wait(10)
        return work(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))
