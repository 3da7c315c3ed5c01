"""A clock a test steps forward: the gateway's time moved on, instead of waited for."""

from __future__ import annotations

import threading
import time


class SteppedClock:
    """Real time plus the steps a test has taken (``advance``): it still moves on its own,
    so what the gateway stamps stays ordered, and a test skips the waits it would make.
    The gateway reads it from its server thread, the test steps it from its own."""

    def __init__(self) -> None:
        self._offset = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return time.time() + self._offset

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset += seconds
