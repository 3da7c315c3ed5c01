"""A ``POST /v1/messages`` request: read, checked, and forwarded with memory's context.

What is stored: the ``messages`` (``blocks``), as chat messages. ``system`` is the
client's prompt, as a chat request's system message is: forwarded as sent, never stored;
memory's own part of the context is added after it (``system`` becomes a list of text
blocks then). The rest of the body (``tools``, ``thinking``, ``metadata``...) is
forwarded as sent, and so is the newest message (``latest``). Prompt-cache marks:
``breakpoints``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway import codec
from gateway.dialects.anthropic.blocks import (
    Converted,
    messages_from_anthropic,
    to_anthropic,
)
from gateway.dialects.anthropic.breakpoints import MAX_BREAKPOINTS, count_marks, place
from gateway.dialects.anthropic.latest import latest_of, restore
from gateway.dialects.chat.request import (
    MessageLimits,
    check_kept_shape,
    check_message_count,
    check_message_sizes,
    check_raw_message_count,
    check_tool_results,
    model_and_stream,
    parse_json,
)
from gateway.dialects.tool_names import is_function_name, name_error, recorded_bad_name
from gateway.errors import InvalidRequest
from gateway.memory.model import Message

THINKING = ("thinking", "redacted_thinking")


@dataclass(frozen=True, slots=True)
class AnthropicRequest:
    body: dict[str, Any]  # the client's JSON, forwarded with ``messages`` replaced
    model: str
    messages: tuple[Message, ...]
    stream: bool
    origins: tuple[str, ...] = ()  # the client's message each of ``messages`` came from
    marks: bool = True  # the stable part's ends marked for the prompt cache
    # The thinking blocks of the request's assistant messages that call tools, by call id:
    # never stored, sent back with their call (``_with_thinking``).
    thinking: tuple[tuple[str, tuple[dict[str, Any], ...]], ...] = ()
    # The blocks of the request's newest message (a user's), forwarded as the client
    # sent them in place of memory's reading of them (``latest``).
    latest: tuple[dict[str, Any], ...] = ()

    def forwarded(
        self, context: Sequence[dict[str, Any]], resolved: frozenset[str] = frozenset()
    ) -> bytes:
        """The body with ``context`` as its conversation: memory's prompt after the
        client's ``system``, and the stable part's ends marked for the prompt cache
        (Anthropic has no item references: ``resolved`` is always empty)."""
        memory, messages = to_anthropic(context)
        body = {**self.body, "messages": messages}
        client = self.body.get("system")
        room = MAX_BREAKPOINTS - count_marks(client) - count_marks(self.body.get("tools"))
        if self.body.get("cache_control") is not None:
            room -= 1  # the request's own mark (automatic caching) is one of the four
        system: list[dict[str, Any]] = []
        if memory:
            kept = [{"type": "text", "text": client}] if isinstance(client, str) and client else []
            system = [*(client if isinstance(client, list) else kept), *memory]
            body["system"] = system
        if self.thinking:
            _with_thinking(messages, dict(self.thinking))
        said = self.messages[-1] if self.messages else None
        restore(messages, self.latest, context, said)
        if self.marks:
            place(system if memory else [], messages, room)
        return codec.dumps(body)

    def check_recorded(self, recorded: Sequence[Message]) -> None:
        """Refuse (400) a tool name memory would keep in ``recorded``, naming the
        client's message it came in."""
        bad = recorded_bad_name(self.messages, recorded)
        if bad is not None:
            at = self.origins[bad.position] if bad.position < len(self.origins) else "messages"
            raise name_error(f"{at}.content", bad.name)


def thinking_of(messages: Any) -> tuple[tuple[str, tuple[dict[str, Any], ...]], ...]:
    """The thinking blocks of each assistant message that calls a tool, by its calls' ids.

    With thinking on, Anthropic wants an assistant turn that called a tool sent back
    with its thinking blocks, unchanged (signed), first: memory keeps no thinking, so the
    ones the client resent go back with their call."""
    found = []
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if message.get("role") != "assistant" or not isinstance(content, list):
            continue
        thoughts = tuple(b for b in content if b.get("type") in THINKING)
        calls = [b.get("id") for b in content if b.get("type") == "tool_use"]
        if thoughts:
            found += [(call, thoughts) for call in calls if isinstance(call, str)]
    return tuple(found)


def _with_thinking(
    messages: list[dict[str, Any]], thinking: dict[str, tuple[dict[str, Any], ...]]
) -> None:
    """Each assistant message that makes a call the client sent with thinking blocks,
    those blocks first (once)."""
    for message in messages:
        if message["role"] != "assistant":
            continue
        blocks = message["content"]
        calls = [b.get("id") for b in blocks if b.get("type") == "tool_use"]
        thoughts = next((thinking[c] for c in calls if c in thinking), ())
        if thoughts and not any(b.get("type") in THINKING for b in blocks):
            message["content"] = [*thoughts, *blocks]


def _check_fields(body: dict[str, Any]) -> tuple[str, bool]:
    model, stream = model_and_stream(body)
    tokens = body.get("max_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise InvalidRequest("max_tokens: required, a positive integer", param="max_tokens")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise InvalidRequest("system: must be a string or an array of text blocks", param="system")
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        # A custom tool's name (server tools name theirs too, from a fixed set).
        if isinstance(tool, dict) and "name" in tool and not is_function_name(tool["name"]):
            raise name_error(f"tools.{i}.name", tool["name"])
    return model, stream


def _checked(converted: Converted, limits: MessageLimits) -> None:
    """What is stored is held to the chat proxy's rules: a shape that passes here may be
    sent again, through any of the three APIs, on every later turn."""
    chat = [m.to_openai() for m in converted.messages]
    for n, message in enumerate(chat):
        check_kept_shape(message, f"{converted.origins[n]}.content")
    check_message_sizes(chat, limits, lambda i, _: f"{converted.origins[i]}.content")
    try:
        check_tool_results(converted.messages, None)
    except InvalidRequest:
        raise InvalidRequest(
            "messages: a tool_result answers no tool_use of the assistant message before it",
            param="messages",
        ) from None


def parse_anthropic_request(
    raw: bytes, limits: MessageLimits, marks: bool = True
) -> AnthropicRequest:
    check_raw_message_count(raw, limits)  # (every message has a "role": as chat's)
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object", code="invalid_json")
    model, stream = _check_fields(body)
    value = body.get("messages")
    check_message_count(value, limits)
    converted = messages_from_anthropic(value)
    _checked(converted, limits)
    return AnthropicRequest(
        body,
        model,
        converted.messages,
        stream,
        converted.origins,
        marks,
        thinking_of(value),
        latest_of(value),
    )
