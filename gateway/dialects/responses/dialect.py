"""The Responses API dialect: ``input`` items in, ``output`` items out, typed events.

What is stored: the ``input``'s messages, function calls and their outputs, and the
answer's ``output`` (``responses_items``). ``instructions`` is the client's prompt: it is
forwarded as sent and never stored, as a chat request's system message is not.

``previous_response_id`` and ``conversation`` name a conversation the upstream holds.
With memory on, the gateway's memory is the conversation: they are removed from the
forwarded body (the upstream would otherwise add its own copy of the history to the
context the gateway built) and the access line says so. ``store`` is forwarded as sent:
it decides only whether the upstream keeps its own copy of the response.

An ``item_reference`` to an answer memory recorded is resolved to memory's copy and not
forwarded; one memory cannot resolve is forwarded as sent, for the upstream that stored
the item to resolve (``memory.references``). One without an id is refused (400).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway import codec, offload
from gateway.dialects.chat.request import (
    MessageLimits,
    check_kept_shape,
    check_message_sizes,
    check_tool_results,
    model_and_stream,
    parse_json,
)
from gateway.dialects.responses.items import (
    Anchor,
    check_function_calls,
    items_from_messages,
    message_from_output,
    messages_from_input,
)
from gateway.dialects.responses.watch import ResponsesWatch, chat_usage
from gateway.dialects.tool_names import check_responses_tools, name_error, recorded_bad_name
from gateway.errors import InvalidRequest
from gateway.memory.model import Message
from gateway.memory.references import is_reference
from gateway.observability import request_log

# Fields that make the upstream add a conversation it holds to the context.
UPSTREAM_HISTORY = ("previous_response_id", "conversation")


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A parsed Responses request; ``passengers``: its items that are forwarded only."""

    body: dict[str, Any]  # the client's JSON, forwarded with ``input`` replaced
    model: str
    messages: tuple[Message, ...]
    stream: bool
    passengers: tuple[tuple[Anchor | None, tuple[dict[str, Any], ...]], ...] = ()

    def forwarded(
        self, context: Sequence[dict[str, Any]], resolved: frozenset[str] = frozenset()
    ) -> bytes:
        """The body with ``context`` as its input, and the request's passengers but the
        references memory ``resolved`` (its context holds those items)."""
        dropped = [name for name in UPSTREAM_HISTORY if self.body.get(name) is not None]
        if dropped:
            request_log.note(upstream_history_dropped=",".join(dropped))
        body = {k: v for k, v in self.body.items() if k not in UPSTREAM_HISTORY}
        body["input"] = items = items_from_messages(context, self.passengers, resolved)
        if self.passengers:
            # References memory could not resolve, left to the upstream: the access line
            # says how many (a 404 from the upstream then names one).
            left = sum(1 for item in items if item.get("type") == "item_reference")
            if left:
                request_log.note(item_references_forwarded=left)
        return codec.dumps(body)

    def check_recorded(self, recorded: Sequence[Message]) -> None:
        """Refuse (400) a function name memory would keep in ``recorded`` (``tool_names``),
        naming the client's function_call item."""
        bad = recorded_bad_name(self.messages, recorded)
        if bad is None:
            return
        param = "input"
        if bad.call is not None:
            call_id = (self.messages[bad.position].tool_calls or ())[bad.call].get("id")
            at = _function_call_item(self.body.get("input"), call_id)
            param = "input" if at is None else f"input.{at}.name"
        raise name_error(param, bad.name)


def _function_call_item(items: Any, call_id: Any) -> int | None:
    """The position of the function_call item with ``call_id`` (ids are unique in an
    input: ``check_function_calls``)."""
    for i, item in enumerate(items if isinstance(items, list) else ()):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "function_call" and item.get("call_id") == call_id:
            return i
    return None


def _between_references(messages: Sequence[Message]) -> list[list[Message]]:
    """The runs of ``messages`` between references."""
    runs: list[list[Message]] = [[]]
    for message in messages:
        if is_reference(message):
            runs.append([])
        else:
            runs[-1].append(message)
    return runs


def _check_fields(body: dict[str, Any]) -> tuple[str, bool]:
    model, stream = model_and_stream(body)
    if "input" not in body:
        raise InvalidRequest("input: required", param="input")
    for name in UPSTREAM_HISTORY:
        value = body.get(name)
        if value is not None and not isinstance(value, (str, dict)):
            raise InvalidRequest(f"{name}: must be a string or an object", param=name)
    return model, stream


def parse_responses_request(raw: bytes, limits: MessageLimits) -> ResponsesRequest:
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object", code="invalid_json")
    model, stream = _check_fields(body)
    items = body["input"]
    if isinstance(items, list) and len(items) > limits.max_messages:
        raise InvalidRequest(
            f"input: {len(items)} items, more than the {limits.max_messages} one request may hold",
            param="input",
            code="too_many_messages",
        )
    converted = messages_from_input(items)
    if not converted.messages:
        raise InvalidRequest("input must hold at least one message", param="input")
    for n, message in enumerate(converted.messages):
        if is_reference(message):
            continue  # no content until resolved (to a message stored already)
        check_kept_shape(message.to_openai(), converted.item(n))
    check_message_sizes([m.to_openai() for m in converted.messages], limits, converted.field)
    try:
        # A reference may be a function call: what follows one is checked from there on,
        # its outputs against memory once resolved (``check_turn_tool_results``).
        for run in _between_references(converted.messages):
            check_tool_results(run, None)
    except InvalidRequest:
        raise InvalidRequest(
            "input: a function_call_output answers no function_call of the items before it",
            param="input",
        ) from None
    check_function_calls(items)
    check_responses_tools(body)
    return ResponsesRequest(body, model, converted.messages, stream, converted.passengers)


class ResponsesDialect:
    name = "responses"

    async def parse(self, raw: bytes, limits: MessageLimits) -> ResponsesRequest:
        return await offload.sized(len(raw), parse_responses_request, raw, limits)

    def requested_output(self, body: Mapping[str, Any]) -> int | None:
        value = body.get("max_output_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        return None

    def answer(self, body: Any) -> Message | None:
        """A whole response's answer: a completed one, or one cut short (``incomplete``,
        as chat records an answer that ends with ``finish_reason: length``); never a
        failed one."""
        if not isinstance(body, dict) or body.get("status") not in ("completed", "incomplete"):
            return None
        return message_from_output(body.get("output"))

    def usage(self, body: Any) -> Any:
        return chat_usage(body.get("usage")) if isinstance(body, dict) else None

    def watch(self) -> ResponsesWatch:
        return ResponsesWatch()


RESPONSES = ResponsesDialect()
