"""What the inspector's pages show, computed from plain data (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class Segment:
    tier: str  # a tier, a section of the memory message ("memory:pins"), or "free"
    tokens: int
    percent: float  # of the bar's width: the budget, or the total when over budget


def _memory_sections(memory: int, sections: dict[str, int]) -> list[tuple[str, int]]:
    """The memory message's tokens split by section. Sections are estimated per item and
    the message is counted whole: the estimates are scaled to the exact total."""
    estimated = sum(sections.values())
    if not memory or not estimated:
        return [("memory", memory)]
    parts = [(f"memory:{name}", memory * tokens // estimated) for name, tokens in sections.items()]
    name, tokens = parts[-1]
    parts[-1] = (name, tokens + memory - sum(t for _, t in parts))  # rounding goes last
    return parts


def budget_bar(receipt: dict[str, Any]) -> list[Segment]:
    """The forwarded context split per tier (the memory message per section), then the
    budget left, as shares of the token budget. A context over budget (the prompt and
    the new messages are always sent) fills the bar: shares are of the total instead."""
    tiers: dict[str, int] = dict(receipt.get("tiers", {}))
    parts: list[tuple[str, int]] = []
    for tier, tokens in tiers.items():
        if tier == "memory":
            parts += _memory_sections(tokens, receipt.get("memory_sections", {}))
        else:
            parts.append((tier, tokens))
    used = sum(tiers.values())
    budget = int(receipt.get("budget_tokens") or 0)
    if budget > used:
        parts.append(("free", budget - used))
    scale = max(budget, used, 1)
    return [
        Segment(tier, tokens, round(100 * tokens / scale, 2)) for tier, tokens in parts if tokens
    ]


def iso(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def index_range(indexes: list[int]) -> str:
    """Window indexes as the receipt header writes them: "12-19", or "" when none."""
    return f"{indexes[0]}-{indexes[-1]}" if indexes else ""
