"""What the upstream says an answer cost: its ``usage``, read defensively (pure).

The dialects give every answer's usage in chat terms (a Responses ``usage`` converted by
``dialects/responses/watch.chat_usage``): ``prompt_tokens``, ``completion_tokens`` and,
where the upstream reports its prompt cache, ``prompt_tokens_details.cached_tokens``.

Notes:
    An upstream's usage is its own business: absent, null, a string, a negative count, or
    a cached count without a prompt count or larger than it, is read as unknown (None),
    never an error. A
    proxied answer must not fail over its bookkeeping, and a Prometheus counter refuses
    a negative increment. A bool is not a count, though Python's ``int`` says it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Usage:
    """The upstream's token counts for one answer; None: it did not say (or said nonsense)."""

    prompt_tokens: int | None = None
    # Of the prompt's tokens, those the upstream's prompt cache served.
    cached_tokens: int | None = None
    completion_tokens: int | None = None

    def to_json(self) -> dict[str, int | None]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
        }


UNKNOWN = Usage()


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def read_usage(usage: Any) -> Usage:
    """An answer's usage in chat terms, each count None where not given or not a count."""
    if not isinstance(usage, dict):
        return UNKNOWN
    prompt = _count(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    if prompt is None or (cached is not None and cached > prompt):
        cached = None  # cached of no known prompt, or more than it: not a share to add up
    return Usage(prompt, cached, _count(usage.get("completion_tokens")))
