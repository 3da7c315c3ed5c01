"""Parsing a Responses request, and the body forwarded for it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.dialects.chat.request import Limits
from gateway.dialects.responses.dialect import RESPONSES, parse_responses_request
from gateway.errors import GatewayError, InvalidRequest, PayloadTooLarge
from gateway.observability import request_log


def parse(body: Any, limits: Limits | None = None) -> Any:
    return parse_responses_request(json.dumps(body).encode(), limits or Limits())


def test_the_forwarded_body_keeps_every_field_but_the_upstream_history() -> None:
    body = {
        "model": "m",
        "input": "hi",
        "instructions": "be brief",
        "previous_response_id": "resp_1",
        "conversation": "conv_1",
        "store": False,
        "tools": [{"type": "function", "name": "f"}],
        "max_output_tokens": 300,
    }
    request = parse(body)
    assert request.model == "m" and not request.stream
    assert [m.to_openai() for m in request.messages] == [{"role": "user", "content": "hi"}]
    context = [{"role": "system", "content": "memory"}, {"role": "user", "content": "hi"}]
    forwarded = json.loads(request.forwarded(context))
    assert forwarded == {
        "model": "m",
        "instructions": "be brief",
        "store": False,
        "tools": [{"type": "function", "name": "f"}],
        "max_output_tokens": 300,
        "input": [
            {"type": "message", "role": "system",
             "content": [{"type": "input_text", "text": "memory"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        ],
    }  # fmt: skip
    assert RESPONSES.requested_output(body) == 300


@pytest.mark.parametrize(
    ("body", "error", "param"),
    [
        ([], InvalidRequest, None),
        ({"input": "x"}, InvalidRequest, "model"),
        ({"model": "m"}, InvalidRequest, "input"),
        ({"model": "m", "input": []}, InvalidRequest, "input"),
        ({"model": "m", "input": [{"type": "reasoning"}]}, InvalidRequest, "input"),
        ({"model": "m", "input": "x", "previous_response_id": 3}, InvalidRequest,
         "previous_response_id"),
        ({"model": "m", "input": [{"role": "user", "content": "x"}] * 3}, InvalidRequest,
         "input"),
        ({"model": "m", "input": "x" * 3000}, PayloadTooLarge, "input"),
        # A part chat would refuse to store (its image_url is no object).
        ({"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_audio", "image_url": "u"}]}]}, InvalidRequest, "input.0"),
        # Fields named as the client sent them: the item (after one only forwarded), the
        # part, and an input_image's image_url string.
        ({"model": "m", "input": [{"type": "reasoning", "summary": []},
                                  {"role": "user", "content": [
                                      {"type": "input_text", "text": "look"},
                                      {"type": "input_image", "image_url": "file:///etc/passwd"},
                                  ]}]}, InvalidRequest, "input.1.content.1.image_url"),
        ({"model": "m", "input": [{"role": "user", "content": "x"},
                                  {"role": "assistant", "content": "y" * 3000}]},
         PayloadTooLarge, "input.1.content"),
        ({"model": "m", "input": [{"role": "user", "content": "x"},
                                  {"type": "function_call_output", "call_id": "c",
                                   "output": "o"}]}, InvalidRequest, "input"),
        # An item_reference names its item by id: nothing to resolve or forward without.
        ({"model": "m", "input": [{"role": "user", "content": "x"},
                                  {"type": "item_reference"}]}, InvalidRequest, "input.1.id"),
        ({"model": "m", "input": [{"type": "item_reference", "id": 7}]}, InvalidRequest,
         "input.0.id"),
        # Every byte of a part that is not text nor an image counts toward the cap: a
        # file's data, an audio clip (before: stored, and resent every turn after).
        ({"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "read this"},
            {"type": "input_file", "filename": "a.pdf", "file_data": "F" * 3000}]}]},
         PayloadTooLarge, "input.0.content"),
    ],
)  # fmt: skip
def test_bad_requests(body: Any, error: type[Exception], param: str | None) -> None:
    with pytest.raises(error) as raised:
        parse(body, Limits(max_messages=2, max_message_bytes=1000))
    assert getattr(raised.value, "param", None) == param


def test_a_whole_answer_is_read_when_completed_or_cut_short() -> None:
    output = [{"type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": "hi"}]}]  # fmt: skip
    answer = RESPONSES.answer({"status": "completed", "output": output})
    assert answer is not None and answer.content == "hi"
    cut = RESPONSES.answer({"status": "incomplete", "output": output})
    assert cut is not None and cut.content == "hi"  # what the client read, as chat's length
    assert RESPONSES.answer({"status": "failed", "output": []}) is None
    assert RESPONSES.answer(None) is None
    usage = {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}
    assert RESPONSES.usage({"usage": usage}) == {
        "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
    }  # fmt: skip


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
_KEYS = st.sampled_from(["type", "role", "content", "call_id", "name", "arguments", "output",
                         "text", "image_url", "file_id", "detail", "refusal"])  # fmt: skip
_ITEM = st.dictionaries(_KEYS, _JSON | st.sampled_from(
    ["message", "user", "assistant", "function_call", "function_call_output", "input_text",
     "input_image", "reasoning"]), max_size=6)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(items=st.lists(_ITEM | _JSON, max_size=5) | _JSON)
def test_any_input_is_parsed_or_refused_with_a_gateway_error(items: Any) -> None:
    try:
        request = parse({"model": "m", "input": items})
    except GatewayError:
        return
    request.forwarded([m.to_openai() for m in request.messages])


def _call(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}


def _output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "o"}


_ASK = {"role": "user", "content": "x"}


@pytest.mark.parametrize(
    ("items", "param", "named"),
    [
        # The red team's: the call, stored, made every later turn fail upstream.
        ([_ASK, _call("c1"), {"role": "user", "content": "y"}], "input.1", "c1"),
        ([_ASK, _call("c1")], "input.1", "c1"),
        ([_ASK, _call("c1"), _call("c2"), _output("c2")], "input.1", "c1"),
        ([_ASK, _call("c1"), _call("c2"), _output("c1")], "input.2", "c2"),
        # An output before its call answers a call memory holds, not this one.
        ([_output("c1"), _call("c1")], "input.1", "c1"),
        ([_ASK, _call("c1"), _call("c1"), _output("c1")], "input.2", "c1"),
        ([_ASK, _call("c1"), _output("c1"), _call("c1"), _output("c1")], "input.3", "c1"),
    ],
)  # fmt: skip
def test_an_unanswered_or_repeated_function_call_is_a_400_naming_it(
    items: list[dict[str, Any]], param: str, named: str
) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse({"model": "m", "input": items})
    assert (raised.value.status, raised.value.type, raised.value.param) == (
        400,
        "invalid_request_error",
        param,
    )
    assert raised.value.message.startswith(param) and repr(named) in raised.value.message


@pytest.mark.parametrize(
    "items",
    [
        [_ASK, _call("c1"), _output("c1")],
        [_ASK, _call("c1"), _call("c2"), _output("c2"), _output("c1")],
        [_ASK, _call("c1"), {"type": "reasoning", "id": "rs_1"}, _output("c1")],
        # Memory holds the call: an agent sends only its output.
        [_output("c1")],
        [_output("c1"), _call("c2"), _output("c2")],
    ],
)  # fmt: skip
def test_answered_function_calls_are_taken(items: list[dict[str, Any]]) -> None:
    request = parse({"model": "m", "input": items})
    calls = [call["id"] for m in request.messages for call in m.tool_calls or ()]
    assert calls == [item["call_id"] for item in items if item.get("type") == "function_call"]


def test_a_function_call_output_may_answer_a_call_sent_by_reference() -> None:
    # A reference may stand for the call: its output is checked once it is resolved.
    request = parse({"model": "m", "input": [
        {"role": "user", "content": "weather?"},
        {"type": "item_reference", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]})  # fmt: skip
    assert [m.role for m in request.messages] == ["user", "assistant", "tool"]


def test_references_memory_resolved_are_not_forwarded_the_others_are() -> None:
    known, unknown = {"type": "item_reference", "id": "msg_1"}, {"type": "item_reference",
                                                                 "id": "msg_x"}  # fmt: skip
    request = parse({"model": "m", "input": [
        {"role": "user", "content": "q"}, known, unknown, {"role": "user", "content": "n"},
    ]})  # fmt: skip
    context = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},  # memory's copy of msg_1
        {"role": "user", "content": "n"},
    ]
    entry, token = request_log.begin([], logged=True)
    try:
        items = json.loads(request.forwarded(context, frozenset({"msg_1"})))["input"]
    finally:
        request_log.end(token)
    assert [i.get("role") or i["id"] for i in items] == ["user", "assistant", "msg_x", "user"]
    assert entry.fields == {"item_references_forwarded": 1}  # on the access line
    # Unresolved (a session that did not hold msg_1): both go, as the client sent them.
    items = json.loads(request.forwarded(context))["input"]
    assert [i.get("role") or i["id"] for i in items] == [
        "user", "assistant", "msg_1", "msg_x", "user"
    ]  # fmt: skip
