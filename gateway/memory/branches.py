"""Abandoned branches of a session: what an edit or a regenerate took off its log (pure).

An edit (a client resending its conversation with an earlier user message changed, see
``reconcile``) starts a new branch where the edit is: the stored messages after that
point leave the log, and with it the window, recall and the summarizer's input. They are
not deleted: the record that truncates the log keeps them, in the same script run, in
the session's branches list, marked with where they branched off, when, and why. A
regenerate's replaced answer is kept the same way. Export shows them; nothing sends
them upstream again.

Durable facts are the one derived tier an edit may reach into (they are extracted every
few messages, so most edits would otherwise be refused, see ``reconcile``): the facts
read from abandoned messages go, a fact they superseded is current again, and the
messages from there on are read again by a catch-up job (``facts_after_branch``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from gateway import codec
from gateway.memory.jobs import Job
from gateway.memory.model import Fact, Message, Tiers

BranchKind = Literal["edit", "regenerate"]


@dataclass(frozen=True, slots=True)
class Branch:
    """Messages abandoned when the log was cut back to ``kept`` messages at ``at``."""

    kept: int  # the log's length they branched off from: the first has index kept + 1
    at: float  # when (Unix time)
    kind: BranchKind  # "edit": user messages were abandoned; "regenerate": an answer
    messages: tuple[Message, ...]  # indexed as they were in the log

    @classmethod
    def from_json(cls, raw: str | bytes) -> Branch:
        data: dict[str, Any] = codec.loads(raw)
        kept = int(data["from"])
        stored = data.get("messages", [])
        # Read only by the memory API's exports (JSON and Markdown): no parse is kept.
        messages = tuple(Message.from_data(m, kept + 1 + i) for i, m in enumerate(stored))
        kind: BranchKind = "edit" if data.get("kind") == "edit" else "regenerate"
        return cls(kept, float(data.get("at", 0.0)), kind, messages)


def facts_after_branch(tiers: Tiers, kept: int, count: int) -> tuple[Tiers, Job] | None:
    """The tiers once the log is cut back to ``kept`` messages and has ``count`` again,
    with the job that reads the facts of what follows the cut: ``None`` when no fact was
    read past the cut.

    A fact read from a range that runs past the cut goes whole (its range is all a fact
    knows of where it came from); the catch-up job reads that range's kept part again.
    """
    if tiers.facts_end <= kept and all(f.end <= kept for f in tiers.facts):
        return None
    gone = [f for f in tiers.facts if f.end > kept]
    staying = [f for f in tiers.facts if f.end <= kept]
    # A key whose current fact went has its newest superseded one current again.
    current = {f.key for f in staying if not f.superseded}
    revived: set[int] = set()
    for position in range(len(staying) - 1, -1, -1):
        fact = staying[position]
        if fact.superseded and fact.key and fact.key not in current:
            current.add(fact.key)
            revived.add(position)
    facts: tuple[Fact, ...] = tuple(
        replace(f, superseded=False) if i in revived else f for i, f in enumerate(staying)
    )
    facts_end = min([tiers.facts_end, kept, *(f.start - 1 for f in gone if f.start > 0)])
    updated = replace(tiers, version=tiers.version + 1, facts=facts, facts_end=facts_end)
    return updated, Job("facts", facts_end + 1, count, count)
