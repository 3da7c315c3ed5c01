"""What the inspector's pages show, computed from plain data (pure)."""

from __future__ import annotations

from collections.abc import Sequence
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


@dataclass(frozen=True, slots=True)
class CacheUse:
    """Of one recorded turn's prompt: what the upstream said it took and served from its
    prompt cache, and what the gateway predicted it could (None: not known)."""

    prompt: int | None  # the upstream's prompt tokens (its usage)
    cached: int | None  # of those, served from its cache (its usage)
    stable: int | None  # the gateway's prediction (the receipt's stable_tokens)


@dataclass(frozen=True, slots=True)
class HitRate:
    cached: int
    prompt: int

    @property
    def percent(self) -> float:
        return round(100 * self.cached / self.prompt, 1)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def cache_use(stored: dict[str, Any]) -> CacheUse:
    """A stored receipt's cache numbers; a receipt from before they were kept has none."""
    usage = stored.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    receipt = stored.get("receipt")
    stable = receipt.get("stable_tokens") if isinstance(receipt, dict) else None
    return CacheUse(
        _count(usage.get("prompt_tokens")), _count(usage.get("cached_tokens")), _count(stable)
    )


def hit_rate(uses: Sequence[CacheUse]) -> HitRate | None:
    """The share of the prompt tokens the upstream served from its cache, over the turns
    whose answer said both; None when none did (an upstream that does not report it)."""
    counted = [u for u in uses if u.prompt is not None and u.cached is not None]
    prompt = sum(u.prompt or 0 for u in counted)
    if not prompt:
        return None
    return HitRate(sum(u.cached or 0 for u in counted), prompt)


@dataclass(frozen=True, slots=True)
class Tag:
    kind: str  # the CSS class: "sent" or "unsent"
    text: str


SENT = Tag("sent", "sent")
NOT_SENT = Tag("unsent", "not sent last time")
NEW = Tag("sent", "sent: new in the last request")
ANSWER = Tag("sent", "the last request's answer")


def window_tags(window: Sequence[dict[str, Any]], receipt: dict[str, Any]) -> dict[int, Tag]:
    """What the last request did with each window message, by index. Its receipt lists
    the stored messages it forwarded; its own new messages (the user's, tool results) had
    no index yet, so they are the ones after every forwarded one, up to its answer: they
    were sent, and the answer came back. A message after that answer (an import since)
    has no tag: the last request never saw it."""
    forwarded = set(receipt.get("window_indexes") or ())
    newest = max(forwarded, default=0)
    tags: dict[int, Tag] = {}
    answered = False
    for message in sorted(window, key=lambda m: int(m["index"])):
        index = int(message["index"])
        if index <= newest:
            tags[index] = SENT if index in forwarded else NOT_SENT
        elif not answered:
            answered = message.get("role") == "assistant"
            tags[index] = ANSWER if answered else NEW
    return tags
