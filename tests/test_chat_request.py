"""Validation of chat-completions bodies: errors name the offending field like OpenAI."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.chat_request import parse_chat_request
from gateway.errors import InvalidRequest
from gateway.memory.model import Message

USER = {"role": "user", "content": "hi"}
_DROP = object()  # a field to leave out of the body


def body(**fields: Any) -> bytes:
    data: dict[str, Any] = {"model": "gpt-4o", "messages": [USER]}
    for key, value in fields.items():
        if value is _DROP:
            data.pop(key, None)
        else:
            data[key] = value
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        pytest.param(b"", "invalid_json", id="empty"),
        pytest.param(b"{", "invalid_json", id="truncated"),
        pytest.param(b"{'model': 'x'}", "invalid_json", id="single quotes"),
        pytest.param(b'{"model": "x",}', "invalid_json", id="trailing comma"),
        pytest.param(b"\xff\xfe{}", "invalid_json", id="not utf-8"),
        pytest.param(b"NaNx", "invalid_json", id="garbage"),
    ],
)
def test_invalid_json(raw: bytes, code: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(raw)
    assert caught.value.status == 400
    assert caught.value.code == code
    assert caught.value.param is None
    assert "not valid JSON" in caught.value.message


@pytest.mark.parametrize("raw", [b"[]", b"[{}]", b'"text"', b"42", b"null", b"true"])
def test_non_object_json(raw: bytes) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(raw)
    assert caught.value.status == 400
    assert caught.value.code == "invalid_json"
    assert "JSON object" in caught.value.message


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        pytest.param(body(messages=_DROP), "messages", id="messages missing"),
        pytest.param(body(messages="hi"), "messages", id="messages a string"),
        pytest.param(body(messages={"role": "user"}), "messages", id="messages an object"),
        pytest.param(body(messages=None), "messages", id="messages null"),
        pytest.param(body(messages=[]), "messages", id="messages empty"),
        pytest.param(body(messages=["hi"]), "messages.0", id="message not object"),
        pytest.param(body(messages=[{"content": "x"}]), "messages.0.role", id="role missing"),
        pytest.param(body(messages=[{"role": "bot"}]), "messages.0.role", id="bad role"),
        pytest.param(body(messages=[USER, {"role": "User"}]), "messages.1.role", id="role case"),
        pytest.param(
            body(messages=[USER, USER, {"role": "robot", "content": "x"}]),
            "messages.2.role",
            id="bad role later",
        ),
        pytest.param(
            body(messages=[{"role": "user", "content": 5}]), "messages.0.content", id="content int"
        ),
        pytest.param(
            body(messages=[{"role": "user", "content": ["text"]}]),
            "messages.0.content",
            id="content parts not objects",
        ),
        pytest.param(
            body(messages=[{"role": "assistant", "tool_calls": "x"}]),
            "messages.0.tool_calls",
            id="tool_calls not list",
        ),
        pytest.param(
            body(messages=[{"role": "tool", "content": "r", "tool_call_id": 7}]),
            "messages.0.tool_call_id",
            id="tool_call_id int",
        ),
        pytest.param(body(model=_DROP), "model", id="model missing"),
        pytest.param(body(model=None), "model", id="model null"),
        pytest.param(body(model=5), "model", id="model int"),
        pytest.param(body(stream="yes"), "stream", id="stream string"),
        pytest.param(body(stream=1), "stream", id="stream int"),
        pytest.param(body(stream=[]), "stream", id="stream list"),
        pytest.param(body(stream_options="x"), "stream_options", id="stream_options string"),
        pytest.param(
            body(stream_options={"include_usage": "maybe"}),
            "stream_options.include_usage",
            id="include_usage",
        ),
    ],
)
def test_invalid_field_names_param(raw: bytes, param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(raw)
    error = caught.value
    assert error.param == param
    assert error.status == 400
    assert error.message.startswith(param)
    assert error.body()["error"]["param"] == param


def test_valid_body_keeps_unknown_fields() -> None:
    data = {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}], "x_extra": 1},
        ],
        "temperature": 0.2,
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "vendor_specific": {"nested": [1, 2]},
        "stream": True,
        "stream_options": {"include_usage": True, "other": "x"},
    }
    request = parse_chat_request(json.dumps(data).encode())
    assert request.body == data
    assert request.model == "gpt-4o-mini"
    assert request.stream is True
    assert request.messages == (
        Message(role="system", content="be brief"),
        Message(role="user", content=[{"type": "text", "text": "hi"}]),
    )


@pytest.mark.parametrize(("stream", "expected"), [(_DROP, False), (None, False), (False, False)])
def test_stream_defaults_to_false(stream: Any, expected: bool) -> None:
    assert parse_chat_request(body(stream=stream)).stream is expected


def test_messages_are_converted() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    request = parse_chat_request(
        body(
            messages=[
                USER,
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": "42", "tool_call_id": "c1"},
                {"role": "developer", "content": "d", "name": "dev"},
            ]
        )
    )
    assert request.messages == (
        Message(role="user", content="hi"),
        Message(role="assistant", content=None, tool_calls=(call,)),
        Message(role="tool", content="42", tool_call_id="c1"),
        Message(role="developer", content="d", name="dev"),
    )
    assert all(message.index == 0 for message in request.messages)
