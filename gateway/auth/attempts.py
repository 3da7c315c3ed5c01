"""Wrong keys per client address: the inspector's login (``ui.login_attempts``) and the
admin API (``auth.admin_attempts``).

The right key always gets in. It is compared first, in constant time, and the count is
never consulted for it: a lockout that refused the right key too let anyone lock the
operator out for everyone behind one address (a NAT, the company's proxy) with ten wrong
guesses. Past ``limit`` wrong keys in ``window_s``, an address's further wrong keys are
answered 429 with ``Retry-After`` instead of 401, the same answer for every wrong key.

Why letting the right key through a lockout is safe: a locked-out guesser learns nothing
from a refused guess (every wrong one gets the same 429), and a right guess tells it what
any login tells its holder, that it got in. No lockout can hide that without locking the
holder out too. What stops guessing is the key itself: the configuration takes none
shorter than 16 characters, and a random one (16 letters and digits: 95 bits; ``openssl
rand -hex 16``: 128) is beyond any number of guesses; the lockout is not what makes it safe. What it
does: it tells a client stuck on a wrong key to stop (Retry-After, not an endless run of
401s), and it bounds what a guesser costs (one counter per address and window).

Addresses are counted as the connection limit counts them (``http.server.client_address``:
an IPv6 client by its /64), so one host cannot spread its guesses, or its counters, over
the 2^64 addresses it is given.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

from gateway.errors import TooManyRequests

# Addresses one process keeps counts for (``LocalFailures``): ~200 bytes each, so ~2 MB.
MAX_ADDRESSES = 10_000


class FailureCounter(Protocol):
    async def failed(self, address: str, window_s: float) -> tuple[int, float]:
        """One more wrong key of ``address`` (its window starts at its first): its wrong
        keys in the window, this one included, and the seconds left in the window. One
        step, so that concurrent guesses cannot all pass a count read before any was made."""
        ...


class Attempts:
    """Wrong keys per address: each caller checks the key itself, then reports a wrong one
    here (``wrong_key``); the right key never comes here."""

    def __init__(self, counter: FailureCounter, *, limit: int, window_s: float, what: str):
        self.counter = counter
        self.limit = limit
        self.window_s = window_s
        self.what = what  # names them in the 429's message: "failed logins", ...

    async def wrong_key(self, address: str) -> None:
        """Count a wrong key of ``address``; past ``limit`` in its window, raise
        ``TooManyRequests`` (429, Retry-After: the window's end, which refused keys do
        not move)."""
        count, left_s = await self.counter.failed(address, self.window_s)
        if count > self.limit:
            raise TooManyRequests(
                f"too many {self.what} from this address; try again later",
                kind="requests",
                retry_after_s=max(1, math.ceil(left_s)),
                limit_headers={},
            )


class LocalFailures:
    """Wrong keys counted in this process's memory (the admin API's): each process counts
    its own, so behind N processes an address has N times the limit per window.

    At most ``max_addresses`` are kept. Every window has the same length, so the dict's
    order (of first failures) is the order windows end in: expired ones are dropped from
    its front, and when it is full of live ones, the oldest goes (that address starts a new
    count; with the right key never locked out, a lost count weakens nothing but the
    back-off it asks for)."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, max_addresses: int = MAX_ADDRESSES
    ) -> None:
        self.clock = clock
        self.max_addresses = max_addresses
        self._counts: dict[str, tuple[int, float]] = {}  # address: (count, window's end)

    async def failed(self, address: str, window_s: float) -> tuple[int, float]:
        now = self.clock()
        self._forget(now)
        count, ends = self._counts.get(address, (0, now + window_s))
        if address not in self._counts and len(self._counts) >= self.max_addresses:
            del self._counts[next(iter(self._counts))]
        self._counts[address] = (count + 1, ends)  # a known address keeps its place
        return count + 1, ends - now

    def _forget(self, now: float) -> None:
        """Drop the windows that are over (all at the front)."""
        while self._counts:
            oldest = next(iter(self._counts))
            if self._counts[oldest][1] > now:
                return
            del self._counts[oldest]
