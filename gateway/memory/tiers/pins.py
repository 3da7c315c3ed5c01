"""Pins (seed 004): the importance heuristic, automatic pins, and which pins are sent."""

from __future__ import annotations

import re
from collections.abc import Sequence

from gateway.memory.model import Message, Pin

# "Pin this: …" / "Remember: …" at the start of a user message pins the rest of it.
_PIN_REQUEST = re.compile(r"^\s*(?:pin this|remember)\s*[:,-]\s*(?P<content>.+)", re.I | re.S)
AUTO_PIN_IMPORTANCE = 0.95


def score_importance(message: Message) -> float:
    """Seed 004's scoreMessageImportance: 0.5 base, plus cues of questions, code, errors."""
    text = message.text.lower()
    score = 0.5
    if "?" in text or text.startswith(("what", "how")):
        score += 0.2
    if "```" in text or "function" in text or "class" in text:
        score += 0.15
    if "error" in text or "problem" in text or "issue" in text:
        score += 0.1
    if len(text) > 200:
        score += 0.1
    if message.role == "assistant":
        score += 0.05
    return round(min(score, 1.0), 4)


def requested_pin(message: Message) -> str | None:
    """The content a user asked to pin, if this message is such a request."""
    if message.role != "user":
        return None
    match = _PIN_REQUEST.match(message.text)
    return match.group("content").strip() if match else None


def top_pins(pins: Sequence[Pin], use: int) -> list[Pin]:
    """Highest importance first, newest first among equals (seed 004's ORDER BY)."""
    return sorted(pins, key=lambda pin: (-pin.importance, -pin.created))[:use]
