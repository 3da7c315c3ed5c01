"""Build what is forwarded, within the token budget, and its receipt (pure).

Order: the client's prompt, then the window (oldest first), then this turn's new
messages. The prompt and the new messages are never dropped, even over budget (the
upstream then reports the overflow in its own words); the window gives way first. New tool
results keep the assistant message that called them, the window's newest message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.memory.model import Message
from gateway.memory.reconcile import Reconciled
from gateway.memory.tiers.window import newest_units
from gateway.tokens import TOKENS_PER_REPLY


@dataclass(frozen=True, slots=True)
class WindowLimits:
    max_messages: int
    max_tokens: int | None
    budget_tokens: int


@dataclass(frozen=True, slots=True)
class Receipt:
    """What went into a forwarded context: tokens per tier and which messages."""

    tiers: dict[str, int]
    window_indexes: tuple[int, ...]
    budget_tokens: int

    @property
    def total_tokens(self) -> int:
        return sum(self.tiers.values()) + TOKENS_PER_REPLY

    def header(self) -> str:
        """Compact form for ``X-Memory-Receipt``: ``prompt=12;window=340;new=25;idx=12-19``."""
        parts = [f"{tier}={tokens}" for tier, tokens in self.tiers.items()]
        if self.window_indexes:
            parts.append(f"idx={self.window_indexes[0]}-{self.window_indexes[-1]}")
        parts.append(f"budget={self.budget_tokens}")
        return ";".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "tiers": dict(self.tiers),
            "total_tokens": self.total_tokens,
            "budget_tokens": self.budget_tokens,
            "window_indexes": list(self.window_indexes),
        }


@dataclass(frozen=True, slots=True)
class Context:
    messages: tuple[Message, ...]
    receipt: Receipt

    def openai_messages(self) -> list[dict[str, Any]]:
        return [message.to_openai() for message in self.messages]


def _tokens(messages: tuple[Message, ...]) -> int:
    return sum(message.tokens for message in messages)


def assemble(turn: Reconciled, limits: WindowLimits) -> Context:
    """Every message must carry its token count (``Message.tokens``)."""
    prior = turn.prior
    caller: tuple[Message, ...] = ()
    if (
        turn.new
        and turn.new[0].role == "tool"
        and prior
        and prior[-1].role == "assistant"
        and prior[-1].tool_calls
    ):
        # New tool results are half of a unit whose other half, the assistant message that
        # called them, is the last prior message: it is kept with them, like them.
        prior, caller = prior[:-1], prior[-1:]
    fixed = _tokens(turn.prompt) + _tokens(caller) + _tokens(turn.new) + TOKENS_PER_REPLY
    room = max(0, limits.budget_tokens - fixed)
    window_cap = room
    if limits.max_tokens is not None:
        window_cap = min(room, max(0, limits.max_tokens - _tokens(caller)))
    window = newest_units(
        prior, max_messages=max(0, limits.max_messages - len(caller)), max_tokens=window_cap
    )
    window += caller
    receipt = Receipt(
        tiers={"prompt": _tokens(turn.prompt), "window": _tokens(window), "new": _tokens(turn.new)},
        window_indexes=tuple(m.index for m in window if m.index),
        budget_tokens=limits.budget_tokens,
    )
    return Context(messages=turn.prompt + window + turn.new, receipt=receipt)
