"""Turns recorded straight into a store as the request path records them, for the
worker's tests: the messages and, in the same round trip (``record.lua``), the jobs they
make due and their notices on the job stream."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gateway.memory.jobs import Job, schedule
from gateway.memory.model import Message
from gateway.presets import Composition
from gateway.store.keys import SessionKeys
from gateway.store.redis_store import Predicted, RedisStore
from tests.support.clients import register_content

_TURN = re.compile(r"\bturn (\d+):")


def turn_of(text: str) -> int:
    """The turn a question of ``Turns`` was asked in (0: none)."""
    found = _TURN.search(text)
    return int(found.group(1)) if found else 0


@dataclass
class Turns:
    """One session's turns: a question naming its turn and a fact, and an answer."""

    store: RedisStore
    composition: Composition
    keys: SessionKeys
    history: list[Message] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)

    async def add(self, now: float = 1_000.0) -> list[Job]:
        """The next turn, recorded with the jobs it makes due (which it returns)."""
        count, turn = len(self.history), len(self.history) // 2 + 1
        new = [
            Message("user", register_content(f"turn {turn}: my seat is {turn}A to Porto."),
                    index=count + 1, ts=now),
            Message("assistant", register_content(f"Noted, seat {turn}A on the Porto flight."),
                    index=count + 2, ts=now),
        ]  # fmt: skip
        # As the request path plans them: from the stored tail and the new messages.
        jobs = schedule(
            self.composition, self.history[-10:] + new, count_before=count, turns_before=turn - 1
        )
        predicted = Predicted(count + 1, turn - 1, jobs)
        recorded = await self.store.sessions.record(
            self.keys, new, now=now, user_id=None, predicted=predicted
        )
        assert recorded.predicted  # the jobs were written with the turn
        self.history += new
        self.jobs += jobs
        return jobs
