"""Validation of chat-completions bodies: errors name the offending field like OpenAI."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessage

from gateway.config import ServerConfig
from gateway.dialects.chat.request import (
    DEFAULT_LIMITS,
    Limits,
    parse_chat_request,
    parse_chat_request_off_loop,
)
from gateway.errors import InvalidRequest, PayloadTooLarge
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


# --- Caps below the body limit (issue 22) ----------------------------------------------


def test_default_caps_are_the_config_defaults() -> None:
    server = ServerConfig()
    assert DEFAULT_LIMITS.max_messages == server.max_messages == 2048
    assert DEFAULT_LIMITS.max_message_bytes == server.max_message_bytes == 1024 * 1024


def test_more_messages_than_the_cap_is_a_400_before_any_is_validated() -> None:
    limits = Limits(max_messages=3)
    assert len(parse_chat_request(body(messages=[USER] * 3), limits).messages) == 3
    # The fourth message is not even a message: the count is refused first.
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(body(messages=[USER] * 3 + [42]), limits)
    assert caught.value.status == 400
    assert (caught.value.param, caught.value.code) == ("messages", "too_many_messages")
    assert "4 messages" in caught.value.message and "3" in caught.value.message


CALL_OF = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": ""}}


@pytest.mark.parametrize(
    ("message", "param"),
    [
        pytest.param({"role": "user", "content": "x" * 101}, "messages.1.content", id="string"),
        pytest.param({"role": "user", "content": "\u00e9" * 51}, "messages.1.content", id="2-byte"),
        pytest.param(
            {"role": "user", "content": "\U0001f600" * 26}, "messages.1.content", id="emoji"
        ),
        pytest.param(
            {"role": "user", "content": [{"type": "text", "text": "x" * 60}] * 2},
            "messages.1.content",
            id="parts",
        ),
        pytest.param(
            {
                "role": "assistant",
                "content": "x" * 50,
                "tool_calls": [{**CALL_OF, "function": {"name": "f", "arguments": "y" * 50}}],
            },
            "messages.1.tool_calls",
            id="tool call",
        ),
        # Every byte of every part but an image counts: an audio clip, a file's data, a
        # part of a type the gateway does not know are stored and resent like text.
        pytest.param(
            {
                "role": "user",
                "content": [
                    {"type": "input_audio", "input_audio": {"data": "A" * 120, "format": "wav"}}
                ],
            },
            "messages.1.content",
            id="audio",
        ),
        pytest.param(
            {"role": "user", "content": [{"type": "file", "file": {"file_data": "B" * 120}}]},
            "messages.1.content",
            id="file data",
        ),
        pytest.param(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "x-unknown", "payload": "C" * 120},
                ],
            },
            "messages.1.content",
            id="unknown part",
        ),
    ],
)
def test_a_message_over_the_size_cap_is_a_413_naming_it(
    message: dict[str, Any], param: str
) -> None:
    with pytest.raises(PayloadTooLarge) as caught:
        parse_chat_request(body(messages=[USER, message]), Limits(max_message_bytes=100))
    assert caught.value.status == 413
    assert (caught.value.param, caught.value.code) == (param, "payload_too_large")
    assert caught.value.message.startswith(param)


@pytest.mark.parametrize(
    "content",
    [
        "x" * 100,
        "\u00e9" * 50,
        "\U0001f600" * 25,
        [
            {"type": "text", "text": "x" * 50},
            {"type": "image_url", "image_url": {"url": "https://example.com/" + "u" * 480}},
        ],
    ],
    ids=["string", "2-byte", "emoji", "image url not counted"],
)
def test_a_message_at_the_size_cap_is_taken(content: Any) -> None:
    parsed = parse_chat_request(
        body(messages=[{"role": "user", "content": content}]), Limits(max_message_bytes=100)
    )
    assert parsed.messages[0].content == content


def test_parsing_off_the_loop_gives_the_same_request() -> None:
    for size in (10, 100_000):  # inline, and in the heavy-work pool
        raw = body(messages=[USER, {"role": "user", "content": "w " * size}])
        off = asyncio.run(parse_chat_request_off_loop(raw, DEFAULT_LIMITS))
        assert off == parse_chat_request(raw)


def test_far_too_many_messages_are_refused_before_the_body_is_parsed() -> None:
    limits = Limits(max_messages=10)
    # Not even JSON after the messages: only a count of the bytes can refuse it.
    raw = b'{"model": "m", "messages": [' + b'{"role": "user", "content": "x"},' * 41
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(raw, limits)
    assert (caught.value.param, caught.value.code) == ("messages", "too_many_messages")
    # "role" inside a content string is escaped, and is not counted.
    quoted = json.dumps({"model": "m", "messages": [USER] * 10 + [
        {"role": "user", "content": '{"role": "x"} ' * 100}]})  # fmt: skip
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(quoted.encode(), limits)  # 11 messages: counted once parsed
    assert "11 messages" in caught.value.message


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "javascript:alert(1)", "gopher://127.0.0.1:6379/_x", "ftp://h/a.png",
     "/etc/passwd", "", "http://", "https://h/a b.png"],
)  # fmt: skip
def test_an_image_url_that_is_not_http_or_data_is_a_400(url: str) -> None:
    content = [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(body(messages=[{"role": "user", "content": content}]), Limits())
    param = "messages.0.content.1.image_url.url"
    assert (caught.value.status, caught.value.param, caught.value.code) == (
        400,
        param,
        "invalid_image",
    )


@pytest.mark.parametrize(
    "url",
    ["https://example.com/cat.png?size=2#x", "HTTP://EXAMPLE.COM/CAT.PNG",
     "data:image/png;base64,iVBORw0KGgo=", "memory-gateway:media/" + "0" * 64],
)  # fmt: skip
def test_http_data_and_reference_image_urls_are_taken(url: str) -> None:
    content = [{"type": "image_url", "image_url": {"url": url}}]
    parsed = parse_chat_request(body(messages=[{"role": "user", "content": content}]), Limits())
    assert parsed.messages[0].content == content


def _asks(*ids: str) -> dict[str, Any]:
    """An assistant message calling a tool once per id."""
    return {"role": "assistant", "content": None, "tool_calls": [{**CALL_OF, "id": i} for i in ids]}


def _answers(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "content": "42", "tool_call_id": call_id}


@pytest.mark.parametrize(
    ("messages", "param", "named"),
    [
        pytest.param([USER, _asks("c1")], "messages.1.tool_calls.0", "c1", id="last message"),
        pytest.param(
            [USER, _asks("c1"), USER], "messages.1.tool_calls.0", "c1", id="user after it"
        ),
        pytest.param(
            [USER, _asks("c1"), {"role": "assistant", "content": "done"}],
            "messages.1.tool_calls.0",
            "c1",
            id="assistant after it",
        ),
        pytest.param(
            [USER, _asks("c1", "c2"), _answers("c1"), USER],
            "messages.1.tool_calls.1",
            "c2",
            id="one of two parallel calls",
        ),
        pytest.param(
            [USER, _asks("c1", "c1"), _answers("c1")],
            "messages.1.tool_calls.1",
            "c1",
            id="repeated in one message",
        ),
        pytest.param(
            [USER, _asks("c1"), _answers("c1"), USER, _asks("c1"), _answers("c1")],
            "messages.4.tool_calls.0",
            "c1",
            id="repeated in a later message",
        ),
    ],
)
def test_a_tool_call_unanswered_or_repeated_is_a_400_naming_it(
    messages: list[dict[str, Any]], param: str, named: str
) -> None:
    """Stored, such a call would be sent on every later turn, and OpenAI refuses it."""
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(body(messages=messages))
    assert (caught.value.status, caught.value.type, caught.value.param) == (
        400,
        "invalid_request_error",
        param,
    )
    assert caught.value.message.startswith(param) and repr(named) in caught.value.message


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param([USER, _asks("c1"), _answers("c1")], id="answered"),
        pytest.param(
            [USER, _asks("c1", "c2"), _answers("c2"), _answers("c1"), USER],
            id="parallel, answered in another order",
        ),
        pytest.param(
            [USER, _asks("c1"), {"role": "system", "content": "s"}, _answers("c1")],
            id="a prompt message between",
        ),
        # Memory holds the call: the client sends only its result.
        pytest.param([_answers("c1")], id="result alone"),
        pytest.param([_answers("c1"), _asks("c2"), _answers("c2")], id="result, then a call"),
    ],
)
def test_answered_tool_calls_are_taken(messages: list[dict[str, Any]]) -> None:
    parsed = parse_chat_request(body(messages=messages))
    assert [m.to_openai() for m in parsed.messages] == messages


# --- An assistant message with nothing in it, and a refused answer -----------------------

# A refused answer as the OpenAI SDK appends it to a history (``message.model_dump()``).
REFUSED = ChatCompletionMessage(
    role="assistant", content=None, refusal="I can't help with that."
).model_dump()


@pytest.mark.parametrize(
    "message",
    [
        pytest.param({"role": "assistant"}, id="content missing"),
        pytest.param({"role": "assistant", "content": None}, id="content null"),
        pytest.param({"role": "assistant", "content": None, "tool_calls": []}, id="no calls"),
        pytest.param({**REFUSED, "refusal": None}, id="the SDK's, no refusal"),
    ],
)
def test_an_assistant_message_with_nothing_in_it_is_a_400_naming_its_content(
    message: dict[str, Any],
) -> None:
    """Stored, it would be sent on every later turn, and OpenAI refuses it."""
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(body(messages=[USER, message, USER]))
    error = caught.value
    assert (error.status, error.type, error.param) == (
        400,
        "invalid_request_error",
        "messages.1.content",
    )
    assert error.message.startswith("messages.1.content: required")


def test_a_refusal_that_is_not_a_string_is_a_400_naming_it() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(body(messages=[USER, {**REFUSED, "refusal": 5}, USER]))
    assert (caught.value.status, caught.value.param) == (400, "messages.1.refusal")


@pytest.mark.parametrize(
    ("message", "content"),
    [
        pytest.param(REFUSED, [{"type": "refusal", "refusal": "I can't help with that."}],
                     id="the SDK's refused answer"),
        pytest.param(
            {"role": "assistant", "content": "Well.", "refusal": "No."},
            [{"type": "text", "text": "Well."}, {"type": "refusal", "refusal": "No."}],
            id="text and a refusal",
        ),
        pytest.param(
            {"role": "assistant", "content": "", "refusal": "No."},
            [{"type": "refusal", "refusal": "No."}],
            id="empty text and a refusal",
        ),
        pytest.param(
            {"role": "assistant", "content": [{"type": "text", "text": "a"}], "refusal": "No."},
            [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "No."}],
            id="parts and a refusal",
        ),
    ],
)  # fmt: skip
def test_a_refused_answer_in_the_history_keeps_its_refusal(
    message: dict[str, Any], content: list[dict[str, Any]]
) -> None:
    parsed = parse_chat_request(body(messages=[USER, message, USER]))
    assert parsed.messages[1] == Message(role="assistant", content=content)
    # What is stored, and forwarded on later turns, is an assistant message the chat
    # API takes: content, not null.
    assert parsed.messages[1].to_openai() == {"role": "assistant", "content": content}


@pytest.mark.parametrize(
    "message",
    [
        pytest.param({**REFUSED, "refusal": "y" * 101}, id="refusal"),
        pytest.param({**REFUSED, "content": "x" * 50, "refusal": "y" * 51}, id="text and refusal"),
    ],
)
def test_a_refusal_counts_toward_the_size_cap(message: dict[str, Any]) -> None:
    """It is stored as the message's content: it is held to the same cap."""
    with pytest.raises(PayloadTooLarge) as caught:
        parse_chat_request(body(messages=[USER, message, USER]), Limits(max_message_bytes=100))
    assert caught.value.param == "messages.1.content"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/a.png",
        "http://localhost:8080/a.png",
        "http://[::1]/a.png",
        "http://10.1.2.3/a.png",
        "http://169.254.169.254/latest/meta-data",
        "http://2130706433/a.png",
        "https://metadata.internal/a.png",
        "http://[::ffff:192.168.0.1]/a.png",
    ],
)
def test_an_image_url_naming_a_private_address_is_refused(url: str) -> None:
    # Stored and sent again every turn, it would point a fetching upstream at itself.
    content = [{"type": "image_url", "image_url": {"url": url}}]
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(body(messages=[{"role": "user", "content": content}]))
    assert caught.value.param == "messages.0.content.0.image_url.url"
    assert caught.value.code == "invalid_image"


def test_an_image_url_naming_a_public_host_is_taken() -> None:
    for url in ("https://example.com/a.png", "https://8.8.8.8/a.png", "http://[2001:4860::8888]/"):
        content = [{"type": "image_url", "image_url": {"url": url}}]
        parsed = parse_chat_request(body(messages=[{"role": "user", "content": content}]))
        assert parsed.messages[0].content == content
