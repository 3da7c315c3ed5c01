"""Polling for a condition that another thread or process makes true on its own time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def reached(check: Callable[[], object], timeout: float = 5.0, every: float = 0.01) -> bool:
    """Whether ``check`` becomes true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def wait_for(
    predicate: Callable[[], object], timeout: float = 10.0, what: str = "the condition"
) -> None:
    """Wait until ``predicate`` is true; fail the test if it is not within ``timeout``."""
    assert reached(predicate, timeout, every=0.02), f"not reached in {timeout} s: {what}"


async def until(
    predicate: Callable[[], object], within_s: float = 10.0, what: str = "the condition"
) -> None:
    """``wait_for`` inside an event loop: the loop runs on while ``predicate`` is polled."""
    deadline = time.monotonic() + within_s
    while not predicate():
        assert time.monotonic() < deadline, f"not reached in {within_s} s: {what}"
        await asyncio.sleep(0.01)
