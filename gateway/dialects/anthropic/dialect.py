"""The Messages dialect: ``messages`` of content blocks in, a ``message`` out, typed
events ending with ``message_stop``.

A session may mix it with the chat-completions and Responses APIs: memory keeps chat
messages (``blocks``), and each API's context is made from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway import offload
from gateway.dialects.anthropic.request import AnthropicRequest, parse_anthropic_request
from gateway.dialects.anthropic.watch import AnthropicWatch, chat_usage, whole_answer
from gateway.dialects.chat.request import MessageLimits
from gateway.memory.model import Message


class AnthropicDialect:
    """``marks``: the gateway marks the context's stable part for the prompt cache
    (``breakpoints``); only with the cache-stable layout (``memory.stable_layout``).
    A context rebuilt every turn changes right after the client's prompt: a mark there
    would be a cache write (billed at 1.25 times) that no later turn reads."""

    name = "messages"

    def __init__(self, *, marks: bool = True) -> None:
        self.marks = marks

    async def parse(self, raw: bytes, limits: MessageLimits) -> AnthropicRequest:
        return await offload.sized(len(raw), parse_anthropic_request, raw, limits, self.marks)

    def requested_output(self, body: Mapping[str, Any]) -> int | None:
        value = body.get("max_tokens")  # (required: checked by parse)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def answer(self, body: Any) -> Message | None:
        return whole_answer(body)

    def usage(self, body: Any) -> Any:
        return chat_usage(body.get("usage")) if isinstance(body, dict) else None

    def watch(self) -> AnthropicWatch:
        return AnthropicWatch()
