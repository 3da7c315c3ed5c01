"""Watching a relayed Responses event stream (pure): did it complete, and what was said?

The client gets the upstream's bytes untouched. The answer is taken from the
``response.completed`` event's ``response.output`` (the upstream's own assembly, function
calls included), or from ``response.incomplete``'s: an answer cut short (at
``max_output_tokens``) is what the client read, recorded as chat records one that ends with
``finish_reason: length``, so a history resent with it still lines up. The text deltas are
kept only to count what was relayed when the stream did not end so. ``response.failed``
and ``error`` end the stream without an answer to record. As for chat
(``dialects/chat/watch.py``), a stream with a payload that is not JSON, bytes that are not
UTF-8 or an event too long to hold is not recorded: nobody read that answer whole.

Memory is bounded by what the watch is fed (the upstream client ends a stream at
``upstream.max_response_bytes``): the deltas' text, and the completed event, which
repeats the answer.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.dialects.events import EventFed, event_named, split_at_last_event, typed_event
from gateway.dialects.responses.items import message_from_output
from gateway.memory.model import Message
from gateway.upstream.sse import SSEDecoder

# The completed event holds the whole answer; ``upstream.max_response_bytes`` (32 MiB by
# default) bounds it before this does.
MAX_EVENT_CHARS = 64 << 20
COMPLETED = "response.completed"
# The events that end a stream with the response's answer (held back until the turn is
# recorded); after the others nothing will be.
ANSWERED = (COMPLETED, "response.incomplete")
FAILED = frozenset({"response.failed", "error"})


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """A Responses ``usage`` in chat terms (what metrics, rate limits and the stored
    receipt read): ``input_tokens_details`` becomes ``prompt_tokens_details``, where the
    upstream says how much of the input its prompt cache served."""
    if not isinstance(usage, dict):
        return None
    chat = {
        "prompt_tokens": usage.get("input_tokens"),
        "completion_tokens": usage.get("output_tokens"),
        "total_tokens": usage.get("total_tokens"),
    }
    details = usage.get("input_tokens_details")
    if isinstance(details, dict):
        chat["prompt_tokens_details"] = {"cached_tokens": details.get("cached_tokens")}
    return chat


def error_event(message: str, code: str, sequence_number: int) -> bytes:
    """An ``error`` event as the Responses API sends one (the SDK yields it as
    ``ResponseErrorEvent``)."""
    data = {
        "type": "error",
        "code": code,
        "message": message,
        "param": None,
        "sequence_number": sequence_number,
    }
    return b"event: error\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


class ResponsesWatch(EventFed):
    def __init__(self) -> None:
        self._decoder = SSEDecoder(max_event_chars=MAX_EVENT_CHARS)
        self._text: list[str] = []
        self._answer: Message | None = None
        self._completed = False
        self._failed = False
        self._usage: dict[str, Any] | None = None
        self._sequence = -1
        self.malformed = 0

    def _add(self, data: str) -> None:
        if data.strip() == "[DONE]":
            return  # some OpenAI-compatible servers end the event stream as chat does
        event = typed_event(data)
        if event is None:
            self.malformed += 1
            return
        number = event.get("sequence_number")
        if isinstance(number, int) and not isinstance(number, bool):
            self._sequence = max(self._sequence, number)
        kind = event["type"]
        if kind == "response.output_text.delta" and isinstance(event.get("delta"), str):
            self._text.append(event["delta"])
        elif kind in ANSWERED:
            response = event.get("response")
            if not isinstance(response, dict):
                self.malformed += 1
                return
            self._completed = True
            self._answer = message_from_output(response.get("output"))
            self._usage = chat_usage(response.get("usage"))
        elif kind in FAILED:
            self._failed = True

    @property
    def done(self) -> bool:
        return self._completed

    @property
    def ended(self) -> bool:
        return self._completed or self._failed

    @property
    def unreadable(self) -> bool:
        return self._decoder.damaged or self.malformed > 0

    @property
    def recordable(self) -> bool:
        return (
            self._completed
            and not self._failed
            and self._answer is not None
            and not self.unreadable
        )

    def message(self) -> Message:
        if self._answer is not None:
            return self._answer
        return Message(role="assistant", content="".join(self._text))

    @property
    def usage(self) -> Any:
        return self._usage

    def split(self, chunk: bytes) -> tuple[bytes, bytes]:
        return split_at_completed(chunk)

    def hold(self, chunk: bytes) -> tuple[bytes, bytes]:
        return split_at_last_event(chunk)

    def error_event(self, message: str, type_: str, code: str) -> bytes:
        return error_event(message, code, self._sequence + 1)

    def acknowledgement(self) -> bytes:
        # Its stream ends with response.completed or it failed: never stored without it.
        return b""


def split_at_completed(chunk: bytes) -> tuple[bytes, bytes]:
    """The bytes before the event that ends the stream with its answer
    (``response.completed`` or ``response.incomplete``), and the rest from it on.

    When the event began in an earlier chunk (or is not recognised in this one), the
    whole chunk is the rest: held back with the event, which is only later, never wrong.
    """
    starts = [at for name in ANSWERED if (at := event_named(chunk, name.encode())) != -1]
    start = min(starts, default=0)
    return chunk[:start], chunk[start:]
