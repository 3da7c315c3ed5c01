"""Watching a relayed Messages event stream (pure), and reading a whole answer.

The client gets the upstream's bytes untouched. The answer is assembled from the content
blocks' events (``content_block_start``, then ``text_delta`` or ``input_json_delta``
pieces), its end read from ``message_delta``'s ``stop_reason``; ``message_stop`` is the
acknowledging event, held back until the turn is recorded. As for chat
(``dialects/chat/watch.py``), a stream with a payload that is not JSON, bytes that are not
UTF-8, an event too long to hold, or a tool call whose input is not JSON is not recorded:
nobody read that answer whole. An ``error`` event ends it without an answer.

Every piece is kept in a list and joined once (as ``chat.accumulate``): what is held is
bounded by what the watch is fed (``upstream.max_response_bytes``).
"""

from __future__ import annotations

import json
from typing import Any

from gateway import codec
from gateway.dialects.anthropic.blocks import answer_message
from gateway.dialects.events import event_named, split_at_last_event
from gateway.memory.model import Message
from gateway.upstream.sse import SSEDecoder

# How an answer may end and be remembered: pause_turn (a server tool's turn to be
# continued by the client) is not an answer yet.
RECORDED = frozenset({"end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"})
MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'

# An error of the gateway's (its type) as Anthropic names its kinds.
_ERROR_TYPES = {"upstream_error": "api_error", "memory_error": "api_error"}


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """A Messages ``usage`` in chat terms (what metrics, rate limits and the receipt
    read): its prompt is the uncached input, the cache's reads and its writes."""
    if not isinstance(usage, dict):
        return None
    counts = {
        name: value if isinstance(value := usage.get(name), int) else 0
        for name in (
            "input_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "output_tokens",
        )
    }
    prompt = (
        counts["input_tokens"]
        + counts["cache_read_input_tokens"]
        + counts["cache_creation_input_tokens"]
    )
    return {
        "prompt_tokens": prompt,
        "completion_tokens": counts["output_tokens"],
        "total_tokens": prompt + counts["output_tokens"],
        "prompt_tokens_details": {"cached_tokens": counts["cache_read_input_tokens"]},
    }


def whole_answer(body: Any) -> Message | None:
    """A whole (non-streamed) answer's message, if it ended as an answer does."""
    if not isinstance(body, dict) or body.get("type") != "message":
        return None
    if body.get("stop_reason") not in RECORDED:
        return None
    return answer_message(body.get("content"))


def error_event(message: str, type_: str) -> bytes:
    """An ``error`` event as Anthropic sends one (the SDK raises it as an APIError)."""
    kind = _ERROR_TYPES.get(type_, type_)
    data = {"type": "error", "error": {"type": kind, "message": message}}
    return b"event: error\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


class _Block:
    __slots__ = ("fields", "pieces")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.pieces: list[str] = []

    def whole(self) -> dict[str, Any]:
        kind = self.fields.get("type")
        if kind == "text":
            return {"type": "text", "text": "".join(self.pieces)}
        if kind == "tool_use":
            raw = "".join(self.pieces)
            tool_input = codec.loads(raw) if raw else self.fields.get("input", {})
            return {**self.fields, "input": tool_input}
        return self.fields


class AnthropicWatch:
    def __init__(self) -> None:
        self._decoder = SSEDecoder()
        self._blocks: dict[int, _Block] = {}
        self._usage: dict[str, Any] = {}
        self._stop_reason: Any = None
        self._stopped = False
        self._failed = False
        self.malformed = 0

    def feed(self, chunk: bytes) -> None:
        for event in self._decoder.feed(chunk):
            self._add(event.data)

    def close(self) -> None:
        for event in self._decoder.close():
            self._add(event.data)

    def _add(self, data: str) -> None:
        try:
            event = codec.loads(data)
        except ValueError:
            self.malformed += 1
            return
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            self.malformed += 1
            return
        try:
            self._apply(event)
        except (KeyError, TypeError, AttributeError):
            self.malformed += 1

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "content_block_delta":
            delta = event["delta"]
            piece = delta.get("text", delta.get("partial_json"))
            if isinstance(piece, str):
                self._blocks[event["index"]].pieces.append(piece)
        elif kind == "content_block_start":
            block = event["content_block"]
            if not isinstance(block, dict):
                raise TypeError("a content block is an object")
            self._blocks[int(event["index"])] = _Block(block)
        elif kind == "message_start":
            self._usage.update(event["message"].get("usage") or {})
        elif kind == "message_delta":
            self._stop_reason = event["delta"].get("stop_reason")
            self._usage.update(event.get("usage") or {})
        elif kind == "message_stop":
            self._stopped = True
        elif kind == "error":
            self._failed = True

    @property
    def done(self) -> bool:
        return self._stopped

    @property
    def ended(self) -> bool:
        return self._stopped or self._failed or self._stop_reason is not None

    @property
    def unreadable(self) -> bool:
        return self._decoder.damaged or self.malformed > 0

    @property
    def recordable(self) -> bool:
        if self._failed or self.unreadable or self._stop_reason not in RECORDED:
            return False
        try:
            self._content()
        except ValueError:
            return False  # a tool call's input that is not JSON
        return True

    def _content(self) -> list[dict[str, Any]]:
        return [self._blocks[i].whole() for i in sorted(self._blocks)]

    def message(self) -> Message:
        try:
            answer = answer_message(self._content())
        except ValueError:
            answer = None
        if answer is not None:
            return answer
        text = [b for b in self._blocks.values() if b.fields.get("type") == "text"]
        return Message(role="assistant", content="".join("".join(b.pieces) for b in text))

    @property
    def usage(self) -> Any:
        return chat_usage(self._usage) if self._usage else None

    def split(self, chunk: bytes) -> tuple[bytes, bytes]:
        start = event_named(chunk, b"message_stop")
        return (chunk[:start], chunk[start:]) if start != -1 else (b"", chunk)

    def hold(self, chunk: bytes) -> tuple[bytes, bytes]:
        return split_at_last_event(chunk)

    def error_event(self, message: str, type_: str, code: str) -> bytes:
        return error_event(message, type_)

    def acknowledgement(self) -> bytes:
        return MESSAGE_STOP
