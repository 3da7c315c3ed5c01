"""Reassemble a chat completion from its stream of chunks (pure).

The gateway records the assistant's answer only when the upstream ended it cleanly: a
``finish_reason`` on the first choice, or ``[DONE]``. Tool calls arrive as fragments keyed
by ``index`` (id and name once, arguments in pieces) and are merged here.

Every piece is kept in a list and joined once, in ``message``: appending each fragment
to a string copied the whole string each time, and an answer of 20,000 argument
fragments (2 MB) took 17 s of the event loop. What is held is the answer's text, so its
memory is bounded by the stream's (``upstream.max_response_bytes``).
"""

from __future__ import annotations

from typing import Any

from gateway import codec
from gateway.memory.model import Message


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("a tool call's name or arguments are not text")  # malformed
    return value


class _ToolCall:
    """One tool call's fragments so far."""

    __slots__ = ("arguments", "id", "name", "type")

    def __init__(self) -> None:
        self.id: Any = ""
        self.type: Any = "function"
        self.name: list[str] = []
        self.arguments: list[str] = []

    def whole(self) -> dict[str, Any]:
        function = {"name": "".join(self.name), "arguments": "".join(self.arguments)}
        return {"id": self.id, "type": self.type, "function": function}


class StreamAccumulator:
    """Folds decoded ``data:`` payloads of one stream into the final assistant message."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.tool_calls: dict[int, _ToolCall] = {}
        self.finish_reason: str | None = None
        self.done = False
        self.error: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.malformed = 0

    def add(self, data: str) -> None:
        if data.strip() == "[DONE]":
            self.done = True
            return
        try:
            chunk = codec.loads(data)
        except ValueError:
            self.malformed += 1
            return
        if not isinstance(chunk, dict):
            self.malformed += 1
            return
        if isinstance(chunk.get("error"), dict):
            self.error = chunk["error"]
            return
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        try:
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict) and choice.get("index", 0) == 0:
                    self._add_choice(choice)
        except (AttributeError, TypeError, ValueError):
            # A chunk of an unexpected shape: the stream is only watched, never broken.
            self.malformed += 1

    def _add_choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") or {}
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        if isinstance(delta.get("refusal"), str):
            self.refusal.append(delta["refusal"])
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            index = int(call.get("index", 0))
            slot = self.tool_calls.get(index)
            if slot is None:
                slot = self.tool_calls[index] = _ToolCall()
            if call.get("id"):
                slot.id = call["id"]
            if call.get("type"):
                slot.type = call["type"]
            function = call.get("function") or {}
            if function.get("name"):
                slot.name.append(_text(function["name"]))
            if function.get("arguments"):
                slot.arguments.append(_text(function["arguments"]))
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]

    @property
    def complete(self) -> bool:
        """The answer ended cleanly and can be recorded as a whole."""
        return self.error is None and (self.finish_reason is not None or self.done)

    def message(self) -> Message:
        calls = tuple(self.tool_calls[i].whole() for i in sorted(self.tool_calls)) or None
        text = "".join(self.content)
        if not text and self.refusal:
            text = "".join(self.refusal)
        return Message(
            role="assistant", content=text if text or not calls else None, tool_calls=calls
        )


def message_from_completion(body: Any) -> Message | None:
    """The first choice's message of a non-streamed completion, if it finished."""
    if not isinstance(body, dict):
        return None
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict) or not choice.get("finish_reason"):
        return None
    content = message.get("content")
    if content is None and isinstance(message.get("refusal"), str):
        content = message["refusal"]
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        calls = [call for call in calls if isinstance(call, dict)]
    kept = tuple(calls) if isinstance(calls, list) and calls else None
    if content is None and kept is None:
        # An empty answer is kept as "" (as a streamed one is): an assistant message
        # with neither content nor calls, sent again, is refused at every later turn.
        content = ""
    return Message(role="assistant", content=content, tool_calls=kept)
