"""Responses API items ⇄ chat-format messages, both ways."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.dialects.responses.items import (
    items_from_messages,
    message_from_output,
    messages_from_input,
)
from gateway.errors import InvalidRequest
from gateway.memory.model import Message

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
}
FUNCTION_CALL = {
    "type": "function_call",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": '{"city":"Paris"}',
}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
REASONING = {"type": "reasoning", "id": "rs_1", "summary": []}
WEB_SEARCH = {"type": "web_search_call", "id": "ws_9", "status": "completed"}


def chat(converted: tuple[Message, ...]) -> list[dict[str, Any]]:
    return [m.to_openai() for m in converted]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("hello", [{"role": "user", "content": "hello"}]),
        ([{"role": "user", "content": "hi"}], [{"role": "user", "content": "hi"}]),
        (
            [{"type": "message", "role": "developer", "content": "be brief"}],
            [{"role": "developer", "content": "be brief"}],
        ),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "a"},
                        {"type": "input_image", "image_url": "https://x/i.png", "detail": "low"},
                    ],
                }
            ],
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a"},
                        {
                            "type": "image_url",
                            "image_url": {"url": "https://x/i.png", "detail": "low"},
                        },
                    ],
                }
            ],
        ),
        (
            [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}],
            [{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-1"}}]}],
        ),
        (
            # An assistant's text parts become one string, as a recorded answer is kept.
            [
                {
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": "Hel"},
                        {"type": "output_text", "text": "lo"},
                    ],
                }
            ],
            [{"role": "assistant", "content": "Hello"}],
        ),
        (
            [{"role": "user", "content": "weather?"}, FUNCTION_CALL, OUTPUT],
            [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
            ],
        ),
        (
            # Text and calls of one answer, and parallel calls: one assistant message.
            [
                {"role": "assistant", "content": "Let me look."},
                FUNCTION_CALL,
                {**FUNCTION_CALL, "call_id": "call_2"},
            ],
            [
                {
                    "role": "assistant",
                    "content": "Let me look.",
                    "tool_calls": [CALL, {**CALL, "id": "call_2"}],
                }
            ],
        ),
        (
            [
                {
                    "type": "function_call_output",
                    "call_id": "c",
                    "output": [{"type": "input_text", "text": "x"}],
                }
            ],
            [{"role": "tool", "content": [{"type": "text", "text": "x"}], "tool_call_id": "c"}],
        ),
        (
            [REASONING, {"role": "user", "content": "hi"}, WEB_SEARCH],
            [{"role": "user", "content": "hi"}],
        ),
    ],
)
def test_input_as_messages(value: Any, expected: list[dict[str, Any]]) -> None:
    assert chat(messages_from_input(value).messages) == expected


@pytest.mark.parametrize(
    ("value", "param"),
    [
        (5, "input"),
        ([5], "input.0"),
        ([{"role": "robot", "content": "x"}], "input.0.role"),
        ([{"role": "user", "content": 5}], "input.0.content"),
        (
            [{"role": "user", "content": [{"type": "input_text", "text": 5}]}],
            "input.0.content.0.text",
        ),
        ([{"role": "user", "content": [{"text": "x"}]}], "input.0.content.0"),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "input.0.call_id"),
        ([{**FUNCTION_CALL, "arguments": {}}], "input.0.arguments"),
        ([{"type": "function_call_output", "call_id": "c"}], "input.0.output"),
        ([{"type": 3}], "input.0.type"),
        (
            [{"role": "user", "content": [{"type": "input_image", "image_url": 3}]}],
            "input.0.content.0.image_url",
        ),
    ],
)
def test_a_shape_memory_cannot_keep_is_refused_naming_the_field(value: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        messages_from_input(value)
    assert raised.value.param == param


def test_context_as_input_items() -> None:
    context = [
        {"role": "system", "content": "[memory] the user's city is Lyon"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "It is sunny."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "and"},
                {"type": "image_url", "image_url": {"url": "u"}},
            ],
        },
    ]
    assert items_from_messages(context) == [
        {
            "type": "message",
            "role": "system",
            "content": [{"type": "input_text", "text": "[memory] the user's city is Lyon"}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "weather?"}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "and"},
                {"type": "input_image", "image_url": "u", "detail": "auto"},
            ],
        },
    ]


def test_a_round_trip_keeps_what_memory_stores() -> None:
    value = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Looking."},
        FUNCTION_CALL,
        OUTPUT,
    ]
    converted = messages_from_input(value).messages
    again = messages_from_input(items_from_messages(chat(converted))).messages
    # The same utterances (a string comes back as one input_text part: the same text).
    assert len(again) == len(converted)
    pairs = zip(again, converted, strict=True)
    assert all(a.same_turn_as(b) and a.tool_calls == b.tool_calls for a, b in pairs)


def test_passengers_ride_before_their_message_and_trailing_ones_at_the_end() -> None:
    trailing = WEB_SEARCH
    value = [{"role": "user", "content": "weather?"}, REASONING, FUNCTION_CALL, OUTPUT, trailing]
    converted = messages_from_input(value)
    items = items_from_messages(chat(converted.messages), converted.passengers)
    assert [item.get("type") for item in items] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "web_search_call",
    ]
    # A passenger whose message is not in the context is not sent.
    items = items_from_messages(chat(converted.messages)[2:], converted.passengers)
    assert REASONING not in items and items[-1] == trailing


def test_an_answer_from_output() -> None:
    output = [
        REASONING,
        {
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "Hi ", "annotations": []},
                {"type": "refusal", "refusal": "no"},
            ],
        },
        {**FUNCTION_CALL, "id": "fc_1", "status": "completed"},
    ]
    # With the ids of all its items, which a later item_reference names.
    items = (("rs_1", "reasoning", ""), ("fc_1", "function_call", "call_1"))
    assert message_from_output(output) == Message(
        role="assistant", content="Hi no", tool_calls=(CALL,), output_items=items
    )
    only_call = message_from_output([FUNCTION_CALL])  # (no id: none kept)
    assert only_call == Message(role="assistant", content=None, tool_calls=(CALL,))
    assert message_from_output([REASONING]) is None
    assert message_from_output("nope") is None


_PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "refusal", "image_url", "file", "input_audio"])},
    optional={
        "text": st.text(max_size=5),
        "refusal": st.text(max_size=5),
        "image_url": st.none() | st.text(max_size=5) | st.fixed_dictionaries({"url": st.text()}),
        "file": st.none() | st.text(max_size=5) | st.fixed_dictionaries({"file_id": st.text()}),
    },
)
_STORED = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"])},
    optional={
        "content": st.none() | st.text(max_size=5) | st.lists(_PART, max_size=3),
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {"id": st.text(min_size=1, max_size=4), "type": st.just("function")},
                optional={"function": st.fixed_dictionaries(
                    {"name": st.text(max_size=4), "arguments": st.text(max_size=4)})},
            ),
            max_size=2,
        ),
        "tool_call_id": st.text(max_size=4),
        "name": st.text(max_size=4),
    },
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(context=st.lists(_STORED, max_size=6))
def test_any_stored_context_becomes_input_items(context: list[dict[str, Any]]) -> None:
    items = items_from_messages(context)
    assert all(isinstance(item, dict) and isinstance(item.get("type"), str) for item in items)
