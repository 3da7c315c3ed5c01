"""A user's durable facts one by one: listed, corrected and deleted through the memory API.

Facts live in their session's tiers, which the jobs write by compare-and-set on the
tiers' version: an edit does the same, and reads again when a job wrote first, so neither
overwrites the other. A fact of a session with a user is corrected (or deleted) in the
user's history and profile too, which the end of the session made from it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from gateway.errors import InvalidRequest, MemoryUnavailable, NotFound
from gateway.memory import durable
from gateway.memory.jobs import Job
from gateway.memory.model import Fact, Tiers
from gateway.memory.session_markdown import iso_time
from gateway.service.ports import Store
from gateway.store.keys import SessionKeys, UserKeys

# Tries of a compare-and-set before giving up (a job writing every few ms would be needed
# to lose them all).
CAS_ATTEMPTS = 8
# What an edit's write names as its job: no job is pending under it (jobs start at
# message 1), so the write drops none.
_EDIT = Job("facts", 0, 0, 0)


def fact_view(session_id: str, fact: Fact) -> dict[str, Any]:
    """A fact as the memory API shows it: its id, its session, and the stored fields."""
    view = {"id": durable.fact_id(fact), "session_id": session_id, **fact.to_data()}
    if fact.ts:
        view["date"] = iso_time(fact.ts)
    return view


class FactEdits:
    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    async def facts(self, keys: SessionKeys) -> tuple[Fact, ...]:
        """The session's facts, oldest first (404 without the session)."""
        exists, tiers = await self.store.sessions.tiers(keys)
        if not exists:
            raise NotFound(f"session {keys.session_id!r} not found", param="session_id")
        return tiers.facts

    async def user_facts(self, user: UserKeys, sessions: Sequence[str]) -> list[dict[str, Any]]:
        """The current facts of each of the user's sessions, newest first."""
        keys = [SessionKeys(user.tenant, sid) for sid in sessions]
        states = await asyncio.gather(*(self.store.sessions.tiers(k) for k in keys))
        found = [
            (fact, k.session_id)
            for k, (_, tiers) in zip(keys, states, strict=True)
            for fact in durable.current(tiers.facts)
        ]
        found.sort(key=lambda pair: -pair[0].ts)  # (stable: a session's order kept)
        return [fact_view(sid, fact) for fact, sid in found]

    async def correct(self, keys: SessionKeys, fact_id: str, text: str) -> Fact:
        """Replace a current fact: the old one is kept superseded, the new one current."""

        def change(tiers: Tiers, position: int) -> tuple[Fact, ...]:
            if tiers.facts[position].superseded:
                raise InvalidRequest(
                    "this fact was superseded: correct the current one",
                    param="fact_id",
                    code="fact_superseded",
                )
            return durable.correct(tiers.facts, position, text, self.clock())

        old, facts = await self._edit(keys, fact_id, change)
        await self._rewrite_for_user(keys, old.text, text)
        return facts[-1]

    async def delete(self, keys: SessionKeys, fact_id: str) -> None:
        old, _ = await self._edit(
            keys, fact_id, lambda tiers, position: durable.without(tiers.facts, position)
        )
        await self._rewrite_for_user(keys, old.text, None)

    async def _edit(
        self,
        keys: SessionKeys,
        fact_id: str,
        change: Callable[[Tiers, int], tuple[Fact, ...]],
    ) -> tuple[Fact, tuple[Fact, ...]]:
        """Apply ``change`` to the session's facts by compare-and-set (read again when a
        job wrote first): the fact changed, and the facts written."""
        for _ in range(CAS_ATTEMPTS):
            exists, tiers = await self.store.sessions.tiers(keys)
            if not exists:
                raise NotFound(f"session {keys.session_id!r} not found", param="session_id")
            position = durable.find(tiers.facts, fact_id)
            if position is None:
                raise NotFound("fact not found", param="fact_id")
            facts = change(tiers, position)
            updated = replace(tiers, version=tiers.version + 1, facts=facts)
            written = await self.store.sessions.write_tiers(keys, tiers.version, updated, _EDIT)
            if written == 1:
                return tiers.facts[position], facts
            if written == -1:
                raise NotFound(f"session {keys.session_id!r} not found", param="session_id")
        raise MemoryUnavailable("the session's tiers kept changing: try again", code="tiers_busy")

    async def _rewrite_for_user(self, keys: SessionKeys, old: str, new: str | None) -> None:
        user_id = (await self.store.sessions.meta(keys)).get("user_id")
        if user_id:
            user = UserKeys(keys.tenant, user_id)
            await self.store.users.rewrite_fact(user, keys.session_id, old, new)
