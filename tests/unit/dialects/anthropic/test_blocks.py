"""Anthropic Messages content ⇄ chat-format messages, and the prompt-cache marks."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.dialects.anthropic.blocks import (
    CONTINUED,
    answer_message,
    messages_from_anthropic,
    to_anthropic,
)
from gateway.dialects.anthropic.breakpoints import count_marks, place
from gateway.errors import InvalidRequest
from gateway.memory.model import Message

PNG = "iVBORw0KGgo="
TOOL_TURN: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "call it", "signature": "s"},
            {"type": "text", "text": "Let me look."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "get_weather",
                "input": {"city": "Paris"},
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C and sunny"},
            {"type": "text", "text": "And tomorrow?", "cache_control": {"type": "ephemeral"}},
        ],
    },
]


def test_a_tool_turn_becomes_chat_messages_with_the_result_before_the_text() -> None:
    converted = messages_from_anthropic(TOOL_TURN)
    roles = [m.role for m in converted.messages]
    assert roles == ["user", "assistant", "tool", "user"]
    assistant = converted.messages[1]
    assert assistant.content == "Let me look."  # thinking is not stored
    assert assistant.tool_calls == (
        {
            "id": "toolu_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        },
    )
    assert converted.messages[2] == Message(
        role="tool", content="18C and sunny", tool_call_id="toolu_1"
    )
    # cache_control is the upstream cache's, not the conversation's: never stored.
    assert converted.messages[3].content == [{"type": "text", "text": "And tomorrow?"}]
    assert converted.origins == ("messages.0", "messages.1", "messages.2", "messages.2")


def test_a_message_resent_without_its_mark_is_the_same_message() -> None:
    marked = messages_from_anthropic(TOOL_TURN).messages[3]
    plain = [{**TOOL_TURN[2], "content": [TOOL_TURN[2]["content"][1] | {"cache_control": None}]}]
    del plain[0]["content"][0]["cache_control"]
    assert messages_from_anthropic(plain).messages[0] == marked


def test_images_and_documents_become_chat_parts_and_unknown_blocks_a_short_text() -> None:
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "document", "source": {"type": "text", "data": "notes"}},
        {"type": "search_result", "source": "x", "content": [{"type": "text", "text": "payload"}]},
    ]
    (message,) = messages_from_anthropic([{"role": "user", "content": content}]).messages
    assert message.content == [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "text", "text": "notes"},
        {"type": "text", "text": "[search_result]"},
    ]


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ([{"role": "tool", "content": "x"}], "messages.0.role"),
        ([{"role": "user"}], "messages.0.content"),
        ([{"role": "user", "content": 7}], "messages.0.content"),
        ([{"role": "user", "content": [{"text": "no type"}]}], "messages.0.content.0"),
        ([{"role": "user", "content": [{"type": "text", "text": 3}]}], "messages.0.content.0.text"),
        (
            [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}],
            "messages.0.content.0.source.media_type",
        ),
    ],
)
def test_what_cannot_be_read_is_refused_naming_the_field(messages: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        messages_from_anthropic(messages)
    assert refused.value.param == param


def test_the_context_goes_out_with_memory_in_system_and_one_message_per_side() -> None:
    context = [
        {"role": "system", "content": "[memory] pins: seat 14C"},
        *[m.to_openai() for m in messages_from_anthropic(TOOL_TURN).messages[:3]],
        {"role": "system", "content": "[recalled] an excerpt"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    system, messages = to_anthropic(context)
    assert system == [{"type": "text", "text": "[memory] pins: seat 14C"}]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
    ]
    # The tool result first (the API requires it after a tool_use), then memory's late
    # message and the new one, in their order.
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C and sunny"},
        {"type": "text", "text": "[recalled] an excerpt"},
        {"type": "text", "text": "And tomorrow?"},
    ]


def test_a_context_that_starts_with_an_answer_starts_with_the_user() -> None:
    _, messages = to_anthropic(
        [{"role": "assistant", "content": "Hi"}, {"role": "user", "content": "x"}]
    )
    assert messages[0] == {"role": "user", "content": [{"type": "text", "text": CONTINUED}]}
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]


def test_images_go_back_as_image_blocks() -> None:
    url = f"data:image/png;base64,{PNG}"
    _, messages = to_anthropic(
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    )
    assert messages[0]["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    ]


def test_an_answer_becomes_the_recorded_message_as_a_resent_one_reads() -> None:
    answer = answer_message(TOOL_TURN[1]["content"])
    resent = messages_from_anthropic([TOOL_TURN[1]]).messages[0]
    assert answer == resent
    assert answer_message("not blocks") is None


def test_marks_go_at_the_end_of_the_window_then_of_memory_within_the_room() -> None:
    system = [{"type": "text", "text": "client"}, {"type": "text", "text": "memory"}]
    _, messages = to_anthropic(
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ]
    )
    assert place(system, messages, 4) == 2
    assert messages[1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert system[-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in messages[2]["content"][-1]
    assert count_marks([system, messages]) == 2

    system = [{"type": "text", "text": "memory"}]
    _, messages = to_anthropic(
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ]
    )
    assert place(system, messages, 1) == 1  # the window's end first
    assert "cache_control" not in system[-1]
    assert place([], messages[-1:], 4) == 0  # nothing stable to mark
