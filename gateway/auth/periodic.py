"""A step repeated in the background until the process stops: what each process keeps
current from Redis (the admin API's keys, the tenant secret)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


async def every(
    seconds: float, step: Callable[[], Awaitable[None]], stop: asyncio.Event, what: str
) -> None:
    """Run ``step`` every ``seconds`` until ``stop``. A step that fails (a Redis outage)
    is logged once, "``what`` failed: …", until one succeeds again, and tried again at
    the next turn."""
    failing = False
    while not stop.is_set():
        try:
            await step()
        except Exception as error:
            if not failing:
                log.warning("%s: %s", what, error)
            failing = True
        else:
            failing = False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=seconds)
