"""Watching a Messages event stream: recorded only once it ended as an answer, read whole."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.dialects.anthropic.watch import AnthropicWatch, chat_usage, whole_answer
from gateway.memory.model import Message


def event(kind: str, **fields: Any) -> bytes:
    data = json.dumps({"type": kind, **fields})
    return f"event: {kind}\ndata: {data}\n\n".encode()


START = event(
    "message_start",
    message={"id": "msg_1", "type": "message", "role": "assistant", "content": [],
             "usage": {"input_tokens": 5, "cache_read_input_tokens": 90, "output_tokens": 1}},
)  # fmt: skip
TEXT = (
    event("content_block_start", index=0, content_block={"type": "text", "text": ""})
    + event("ping")
    + event("content_block_delta", index=0, delta={"type": "text_delta", "text": "Your seat "})
    + event("content_block_delta", index=0, delta={"type": "text_delta", "text": "is 14C."})
    + event("content_block_stop", index=0)
)
CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}


def json_piece(piece: str) -> bytes:
    return event(
        "content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": piece}
    )


TOOL = (
    event("content_block_start", index=1, content_block=CALL)
    + json_piece('{"ci')
    + json_piece('ty": "Paris"}')
    + event("content_block_stop", index=1)
)
NOT_JSON = b"event: content_block_delta\ndata: {not json\n\n"
BAD_INPUT = TOOL.replace(b"Paris", b'Par\\"is')  # the input's JSON is broken
STOP = event("message_stop")


def delta(reason: str) -> bytes:
    return event("message_delta", delta={"stop_reason": reason}, usage={"output_tokens": 7})


def watched(*chunks: bytes) -> AnthropicWatch:
    watch = AnthropicWatch()
    for chunk in chunks:
        watch.feed(chunk)
    return watch


def test_a_text_answer_is_recorded_with_its_usage_in_chat_terms() -> None:
    watch = watched(START + TEXT + delta("end_turn"), STOP)
    assert watch.done and watch.ended and watch.recordable
    assert watch.message() == Message(role="assistant", content="Your seat is 14C.")
    assert watch.usage == {
        "prompt_tokens": 95,
        "completion_tokens": 7,
        "total_tokens": 102,
        "prompt_tokens_details": {"cached_tokens": 90},
    }


def test_a_tool_call_is_assembled_from_its_pieces() -> None:
    watch = watched(START + TEXT + TOOL + delta("tool_use") + STOP)
    assert watch.recordable
    assert watch.message().tool_calls == (
        {
            "id": "toolu_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        },
    )


@pytest.mark.parametrize(
    ("chunks", "ended"),
    [
        ((START, TEXT), False),  # cut off
        ((START, TEXT, event("error", error={"type": "overloaded_error", "message": "x"})), True),
        ((START, TEXT, NOT_JSON, delta("end_turn"), STOP), True),
        ((START, TEXT, delta("pause_turn"), STOP), True),  # a server tool's turn, continued later
        ((START, BAD_INPUT, delta("tool_use"), STOP), True),
    ],
)  # fmt: skip
def test_what_did_not_end_as_a_whole_answer_is_not_recorded(
    chunks: tuple[bytes, ...], ended: bool
) -> None:
    watch = watched(*chunks)
    assert not watch.recordable
    assert watch.ended is ended


def test_message_stop_is_held_back_and_can_be_made() -> None:
    watch = AnthropicWatch()
    chunk = TEXT + delta("end_turn") + STOP
    before, rest = watch.split(chunk)
    assert (before, rest) == (TEXT + delta("end_turn"), STOP)
    assert watch.split(TEXT) == (b"", TEXT)  # not in this chunk: all held with it
    assert watch.acknowledgement() == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    error = watch.error_event("not stored", "memory_error", "memory_not_recorded")
    assert error.startswith(b"event: error\ndata: ")
    assert json.loads(error.split(b"data: ", 1)[1]) == {
        "type": "error",
        "error": {"type": "api_error", "message": "not stored"},
    }


def test_a_whole_answer_is_read_when_it_ended_as_an_answer() -> None:
    body = {"type": "message", "stop_reason": "max_tokens",
            "content": [{"type": "text", "text": "cut"}]}  # fmt: skip
    assert whole_answer(body) == Message(role="assistant", content="cut")
    assert whole_answer({**body, "stop_reason": "pause_turn"}) is None
    assert whole_answer({"type": "error", "error": {}}) is None
    assert chat_usage({"input_tokens": 3, "cache_creation_input_tokens": 4})["prompt_tokens"] == 7
