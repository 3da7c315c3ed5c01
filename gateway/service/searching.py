"""The memory API's search: a query answered with a session's (or a user's) relevant
memories — verbatim excerpts of their archives, their durable facts and their pins.

Excerpts are ranked by recall itself (``memory.recall``: words and meaning fused, the
neighbours' spill, the second pass), as a turn would recall them. Facts and pins are
short texts with no neighbours: they are ranked by the same scoring over an archive of
their own, without the spill and the second pass. Each kind's scores are recall's fused
scores (the best word match of the kind counts 1).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.memory import durable, recall
from gateway.memory.archive import Archive
from gateway.memory.model import Message
from gateway.memory.session_markdown import iso_time
from gateway.presets import RecallTier
from gateway.service.memory_service import MemoryService
from gateway.store.keys import SessionKeys

# An excerpt shows this much of a long message (a pasted document is not an excerpt).
EXCERPT_CHARS = 2000
# A user's search reads at most this many of their sessions, the last active (their
# archives are read, and held, like a turn's).
MOST_SESSIONS = 32
# The tiers and pins of a session are read with this few messages of its tail.
_TAIL = 1

Kind = Literal["excerpt", "fact", "pin"]


@dataclass(frozen=True, slots=True)
class Item:
    """A fact or a pin, searched as a one-message text."""

    kind: Kind
    session_id: str
    id: str
    text: str
    ts: float


def result(
    kind: Kind, session_id: str, item_id: Any, text: str, ts: float, score: float
) -> dict[str, Any]:
    if len(text) > EXCERPT_CHARS:
        text = text[:EXCERPT_CHARS] + "…"
    return {
        "kind": kind,
        "session_id": session_id,
        "id": item_id,
        "text": text,
        "ts": ts or None,
        "date": iso_time(ts) if ts else None,
        "score": round(score, 6),
    }


class Search:
    def __init__(self, memory: MemoryService) -> None:
        self.store = memory.store
        self.held = memory.held
        # Without a recall tier in the preset, recall's defaults (words only: no vectors
        # are held without one).
        self.tier = memory.composition.recall or RecallTier()

    async def search(
        self, tenant: str, sessions: Sequence[str], query: str, limit: int
    ) -> list[dict[str, Any]]:
        """The best ``limit`` memories of the sessions for ``query``, best first."""
        keys = [SessionKeys(tenant, sid) for sid in sessions[:MOST_SESSIONS]]
        archives = [await self.held.current(k, self.tier) for k in keys]
        states = await asyncio.gather(*(self.store.sessions.load(k, _TAIL) for k in keys))
        items = [
            Item("fact", k.session_id, durable.fact_id(f), f.text, f.ts)
            for k, state in zip(keys, states, strict=True)
            for f in durable.current(state.tiers.facts)
        ] + [
            Item("pin", k.session_id, p.id, p.content, p.created)
            for k, state in zip(keys, states, strict=True)
            for p in state.pins
        ]
        found = self._excerpts(keys, archives, query, limit)
        found += await self._items(items, query, limit)
        found.sort(key=lambda r: (-r["score"], -(r["ts"] or 0.0)))
        return found[:limit]

    def _weights(self, *, short: bool) -> recall.Weights:
        semantic = self.tier.semantic_weight if self.held.vectors is not None else 0.0
        if short:  # not a conversation: no neighbours, too short to expand the query from
            return recall.Weights(
                semantic=semantic, neighbour=0.0, feedback=0.0, around=0.0, spread=False
            )
        # Excerpts are ranked on one scale with facts and pins: the lift around strong hits
        # and the spread of words, which fill a context, would put a conversation's
        # messages above the facts drawn from them (a correction below what it replaces).
        return recall.Weights(
            semantic=semantic, neighbour=self.tier.neighbour_weight, around=0.0, spread=False
        )

    def _query(self, query: str, archives: Sequence[Archive]) -> recall.Query:
        vectors = self.held.vectors
        return recall.build_query(
            query,
            known=recall.vocabulary(archives),
            embed=vectors.query if vectors is not None else None,
        )

    def _excerpts(
        self, keys: Sequence[SessionKeys], archives: Sequence[Archive], query: str, limit: int
    ) -> list[dict[str, Any]]:
        sources = [recall.Source(archive) for archive in archives]
        hits = recall.rank(
            sources, self._query(query, archives), limit=limit, weights=self._weights(short=False)
        )
        out = []
        for hit in hits:
            message = archives[hit.source].message(hit.index)
            if message is not None:
                sid = keys[hit.source].session_id
                out.append(
                    result("excerpt", sid, message.index, message.text, message.ts, hit.score)
                )
        return out

    async def _items(self, items: Sequence[Item], query: str, limit: int) -> list[dict[str, Any]]:
        if not items:
            return []
        messages = [Message("user", item.text, index=i + 1) for i, item in enumerate(items)]
        archive = Archive("items")
        archive.extend(messages, await self._vectors(messages))
        hits = recall.rank(
            [recall.Source(archive)],
            self._query(query, [archive]),
            limit=limit,
            weights=self._weights(short=True),
        )
        return [
            result(item.kind, item.session_id, item.id, item.text, item.ts, hit.score)
            for hit in hits
            for item in (items[hit.index - 1],)
        ]

    async def _vectors(self, messages: Sequence[Message]) -> list[bytes | None]:
        if self.held.vectors is None:
            return [None] * len(messages)
        return [raw or None for raw in await self.held.encode(messages)]
