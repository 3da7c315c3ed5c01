"""What the memory policies need of a tokenizer: a text's count, and the chat format's
framing. The tokenizer itself (``gateway.text.tokens``, tiktoken) is passed in, so the
policies stay pure and the tokenizer can count ``Message`` values without a cycle."""

from __future__ import annotations

from typing import Protocol

# OpenAI's accounting: each message costs a few tokens of framing, a reply 3 more.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_REPLY = 3


class TextCounter(Protocol):
    """Counts a text's tokens (``tokens.TokenCounter`` is one)."""

    def count_text(self, text: str, model: str | None = None) -> int: ...
