"""Requests start a few per client address a turn of the event loop, the addresses in turn.

Every request a connection's head completes used to start its task at once. A client that
reopens hundreds of connections together (each refused, 429, and reopened: the
three-address attack of ``bench/abuse.py``) then put hundreds of tasks on the loop in one
turn, and every other client's next step waited behind all of them: ~0.2 ms each, a
700-connection burst held the loop for tens of ms, every second.

Here a client address starts at most ``STARTS_PER_TURN`` requests a turn; the rest wait
in its queue, and each later turn starts the next few of every address with some waiting,
in turn, after the loop has polled for everyone's I/O. A client that sends few requests
at once never waits (nothing is queued: the start is immediate, as before); a burst from
one address is spread over turns while other addresses' requests start as they come:
the round robin of the heavy-work pool (``offload``), at the one point every request
passes, its start.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

# Requests one client address starts in one turn of the loop. Small: the turns are short
# (a turn runs only what is ready), so even a queued burst starts within milliseconds.
STARTS_PER_TURN = 4

Start = Callable[[], None]


class FairStarts:
    """One server's request starts, paced per client address (see the module's notes)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, per_turn: int = STARTS_PER_TURN) -> None:
        self.loop = loop
        self.per_turn = per_turn
        # Starts made this turn, by address (cleared by the next turn's callback).
        self.started: collections.Counter[str] = collections.Counter()
        # Addresses with starts waiting, in the order they are served (a dict keeps it).
        self.waiting: dict[str, collections.deque[Start]] = {}
        self.turn_due = False

    def start(self, address: str, begin: Start) -> None:
        """Call ``begin`` now, or in a later turn when ``address`` has started its share
        of this one or has earlier starts waiting."""
        # (An address with starts waiting has made its share of this turn's already: a
        # new one goes behind them.)
        if self.started[address] < self.per_turn:
            self.started[address] += 1
            self._next_turn()
            begin()
            return
        self.waiting.setdefault(address, collections.deque()).append(begin)
        self._next_turn()

    def _next_turn(self) -> None:
        if not self.turn_due:
            self.turn_due = True
            self.loop.call_soon(self._turn)

    def _turn(self) -> None:
        self.turn_due = False
        self.started.clear()
        for address in list(self.waiting):
            queue = self.waiting.pop(address)
            for _ in range(min(self.per_turn, len(queue))):
                self.started[address] += 1
                try:
                    queue.popleft()()
                except Exception:  # (one start's failure is not the others' too)
                    log.exception("a request could not be started")
            if queue:
                self.waiting[address] = queue  # the rest of it goes to the back of the line
        if self.waiting:
            self._next_turn()
