"""A Messages request: checked, and forwarded with memory's context."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.dialects.anthropic.request import parse_anthropic_request
from gateway.dialects.chat.request import Limits
from gateway.errors import InvalidRequest, PayloadTooLarge

THOUGHT = {"type": "thinking", "thinking": "I should call it.", "signature": "sig-1"}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
LOOP = [
    {"role": "user", "content": "weather in Oslo?"},
    {"role": "assistant", "content": [THOUGHT, CALL]},
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3C"}],
    },
]


def parsed(marks: bool = True, **fields: Any) -> Any:
    body = {"model": "claude-x", "max_tokens": 100, "messages": LOOP, **fields}
    return parse_anthropic_request(json.dumps(body).encode(), Limits(), marks)


def forwarded(request: Any, memory: str | None = "[memory] seat 14C") -> dict[str, Any]:
    context = [m.to_openai() for m in request.messages]
    if memory is not None:
        context.insert(0, {"role": "system", "content": memory})
    return dict(json.loads(request.forwarded(context)))


def test_a_tool_call_goes_back_with_the_thinking_the_client_resent() -> None:
    body = forwarded(parsed(thinking={"type": "enabled", "budget_tokens": 1024}))
    assistant = body["messages"][1]
    # Signed thinking first, unchanged, as Anthropic requires in a tool loop.
    assert assistant["content"][0] == THOUGHT
    assert assistant["content"][1]["type"] == "tool_use"
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}


def test_memory_follows_the_clients_system_and_the_stable_ends_are_marked() -> None:
    body = forwarded(parsed(system="Be brief."))
    assert [block["text"] for block in body["system"]] == ["Be brief.", "[memory] seat 14C"]
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert body["messages"][1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert not any("cache_control" in block for block in body["messages"][2]["content"])


def test_the_clients_marks_are_kept_and_counted_first() -> None:
    system = [
        {"type": "text", "text": f"s{i}", "cache_control": {"type": "ephemeral"}} for i in range(3)
    ]
    body = forwarded(parsed(system=system))
    marks = json.dumps(body).count('"cache_control"')
    assert marks == 4  # the client's three, and the window's end: Anthropic's limit
    assert body["system"][:3] == system
    assert "cache_control" not in body["system"][-1]


def test_without_memory_or_marks_the_system_is_the_clients_as_sent() -> None:
    body = forwarded(parsed(marks=False, system="Be brief."), memory=None)
    assert body["system"] == "Be brief."
    assert "cache_control" not in json.dumps(body)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"model": ""}, "model"),
        ({"stream": "yes"}, "stream"),
        ({"system": 3}, "system"),
        ({"tools": [{"name": "get weather", "input_schema": {}}]}, "tools.0.name"),
        # A result that answers no call of the answer before it (one that leads the
        # messages may answer a call memory holds: checked against the session).
        ({"messages": [LOOP[0], {"role": "assistant", "content": "hm"}, LOOP[2]]}, "messages"),
    ],
)
def test_what_anthropic_would_refuse_is_refused_naming_the_field(
    fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parsed(**fields)
    assert refused.value.param == param
    assert refused.value.status == 400


def test_a_message_over_the_cap_is_refused() -> None:
    huge = [{"role": "user", "content": "x" * (Limits().max_message_bytes + 1)}]
    with pytest.raises(PayloadTooLarge) as refused:
        parsed(messages=huge)
    assert refused.value.param == "messages.0.content"


def test_more_messages_than_a_request_may_hold_are_refused() -> None:
    limits = Limits(max_messages=4)
    many = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}] * 3
    raw = json.dumps({"model": "m", "max_tokens": 5, "messages": many}).encode()
    with pytest.raises(InvalidRequest) as refused:
        parse_anthropic_request(raw, limits)
    assert (refused.value.param, refused.value.code) == ("messages", "too_many_messages")
    # Far more than that: refused from the bytes, before they are parsed.
    raw = json.dumps({"model": "m", "max_tokens": 5, "messages": many * 10}).encode()
    with pytest.raises(InvalidRequest, match="more than the 4 messages"):
        parse_anthropic_request(raw, limits)
