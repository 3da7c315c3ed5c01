"""Watching a relayed Messages event stream (pure), and reading a whole answer.

The client gets the upstream's bytes untouched. The answer is assembled from the content
blocks' events (``content_block_start``, then ``text_delta`` or ``input_json_delta``
pieces), its end read from ``message_delta``'s ``stop_reason``; ``message_stop`` is the
acknowledging event, held back until the turn is recorded. As for chat
(``dialects/chat/watch.py``), a stream with a payload that is not JSON, bytes that are not
UTF-8, an event too long to hold, an event of the wrong shape (an index that is not a
number, a usage that is not an object), a ``message_stop`` with no ``stop_reason`` before
it, or a tool call whose input is not a JSON object is unreadable: nobody read that
answer whole, so it is not recorded and its ``message_stop`` is not passed on (an error
event takes its place). An ``error`` event ends it without an answer. Any stop reason
but ``pause_turn`` (a server tool's turn, continued by the client) ends an answer, a
reason this gateway does not know yet included: the client read it whole, and was told
so.

Every piece is kept in a list and joined once (as ``chat.accumulate``): what is held is
bounded by what the watch is fed (``upstream.max_response_bytes``).
"""

from __future__ import annotations

import json
from typing import Any

from gateway import codec
from gateway.dialects.anthropic.blocks import answer_message
from gateway.dialects.events import EventFed, event_named, split_at_last_event, typed_event
from gateway.errors import anthropic_error
from gateway.memory.model import Message
from gateway.upstream.sse import SSEDecoder

# A stop reason that does not end an answer: a server tool's turn, continued by the client.
NOT_AN_ANSWER = "pause_turn"
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


def ends_an_answer(stop_reason: Any) -> bool:
    """Whether a message that stopped for this reason is an answer to remember."""
    return isinstance(stop_reason, str) and stop_reason != NOT_AN_ANSWER


def whole_answer(body: Any) -> Message | None:
    """A whole (non-streamed) answer's message, if it ended as an answer does."""
    if not isinstance(body, dict) or body.get("type") != "message":
        return None
    if not ends_an_answer(body.get("stop_reason")):
        return None
    return answer_message(body.get("content"))


def error_event(message: str, type_: str) -> bytes:
    """An ``error`` event as Anthropic sends one (the SDK raises it as an APIError)."""
    data = anthropic_error(_ERROR_TYPES.get(type_, type_), message)
    return b"event: error\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


class _Block:
    __slots__ = ("fields", "pieces")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.pieces: list[str] = []

    def whole(self) -> dict[str, Any]:
        kind = self.fields.get("type")
        if kind == "text":
            # Its start's text too (Anthropic's is empty; a proxy's may not be): the SDKs
            # show the client both.
            start = self.fields.get("text")
            return {
                "type": "text",
                "text": "".join([start if isinstance(start, str) else "", *self.pieces]),
            }
        if kind == "tool_use":
            raw = "".join(self.pieces)
            tool_input = codec.loads(raw) if raw else self.fields.get("input", {})
            if not isinstance(tool_input, dict):
                raise ValueError("a tool call's input is a JSON object")
            return {**self.fields, "input": tool_input}
        return self.fields


def _index(value: Any) -> int:
    """A content block's index: an integer (JSON's 1.0 included), else a malformed event."""
    if isinstance(value, float) and value.is_integer():  # (never inf or NaN)
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("a content block's index is an integer")
    return value


def _usage(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError("a usage is an object")
    return value


class AnthropicWatch(EventFed):
    def __init__(self) -> None:
        self._decoder = SSEDecoder()
        self._blocks: dict[int, _Block] = {}
        self._usage: dict[str, Any] = {}
        self._stop_reason: Any = None
        self._stopped = False
        self._failed = False
        self.malformed = 0
        self._read: tuple[Message | None] | None = None  # the answer, once read (``_answer``)

    def _add(self, data: str) -> None:
        self._read = None
        event = typed_event(data)
        if event is None:
            self.malformed += 1
            return
        try:
            self._apply(event)
        except (KeyError, TypeError, AttributeError):
            # An event of the wrong shape: whatever the upstream sent, it is relayed as
            # it came and the stream goes on (never a gateway error in mid-stream).
            self.malformed += 1

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "content_block_delta":
            delta = event["delta"]
            piece = delta.get("text", delta.get("partial_json"))
            if isinstance(piece, str):
                self._blocks[_index(event["index"])].pieces.append(piece)
        elif kind == "content_block_start":
            block = event["content_block"]
            if not isinstance(block, dict):
                raise TypeError("a content block is an object")
            self._blocks[_index(event["index"])] = _Block(block)
        elif kind == "message_start":
            self._usage.update(_usage(event["message"].get("usage")))
        elif kind == "message_delta":
            reason = event["delta"].get("stop_reason")
            if reason is not None and not isinstance(reason, str):
                raise TypeError("a stop reason is a string")
            self._stop_reason = reason
            self._usage.update(_usage(event.get("usage")))
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
        if self._decoder.damaged or self.malformed > 0:
            return True
        if self._failed:
            return False  # ended by an error event: no answer to have misread
        if self._stopped and self._stop_reason is None:
            return True  # message_stop, but nothing said how the message ended
        return self._stop_reason is not None and self._answer() is None

    @property
    def recordable(self) -> bool:
        if self._failed or self.unreadable or not ends_an_answer(self._stop_reason):
            return False
        return self._answer() is not None

    def _answer(self) -> Message | None:
        """The answer as memory keeps it; None: its blocks cannot be read (a tool call's
        input that is not a JSON object, a call with no id). Read once per event fed."""
        if self._read is None:
            try:
                content = [self._blocks[i].whole() for i in sorted(self._blocks)]
            except ValueError:
                self._read = (None,)
            else:
                self._read = (answer_message(content),)
        return self._read[0]

    def message(self) -> Message:
        answer = self._answer()
        if answer is not None:
            return answer
        # What was relayed of it, when it cannot be read whole (the text, as the SDK shows it).
        blocks = [self._blocks[i] for i in sorted(self._blocks)]
        text = [b.whole()["text"] for b in blocks if b.fields.get("type") == "text"]
        return Message(role="assistant", content="".join(text))

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
