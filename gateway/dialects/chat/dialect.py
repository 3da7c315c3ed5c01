"""The chat-completions dialect: ``messages`` in, ``choices`` out, ``[DONE]`` at the end."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.dialects.chat.accumulate import message_from_completion
from gateway.dialects.chat.request import (
    ChatRequest,
    MessageLimits,
    parse_chat_request_off_loop,
)
from gateway.dialects.chat.watch import StreamWatch, split_at_done
from gateway.errors import sse_error_event
from gateway.memory.model import Message
from gateway.memory.model_budget import requested_output


class ChatWatch(StreamWatch):
    """``StreamWatch``, acknowledged by ``[DONE]``, with OpenAI's in-band error chunk."""

    def split(self, chunk: bytes) -> tuple[bytes, bytes]:
        return split_at_done(chunk)

    def hold(self, chunk: bytes) -> tuple[bytes, bytes]:
        # Nothing: [DONE] is a few bytes, and split finds its line in the chunk it ends.
        return chunk, b""

    def error_event(self, message: str, type_: str, code: str) -> bytes:
        return sse_error_event(message, type_, code)

    def acknowledgement(self) -> bytes:
        return b"data: [DONE]\n\n"


class ChatDialect:
    name = "chat.completions"

    async def parse(self, raw: bytes, limits: MessageLimits) -> ChatRequest:
        return await parse_chat_request_off_loop(raw, limits)

    def requested_output(self, body: Mapping[str, Any]) -> int | None:
        return requested_output(body)

    def answer(self, body: Any) -> Message | None:
        return message_from_completion(body)

    def usage(self, body: Any) -> Any:
        return body.get("usage") if isinstance(body, dict) else None

    def watch(self) -> ChatWatch:
        return ChatWatch()


CHAT = ChatDialect()
