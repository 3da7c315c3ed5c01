"""The Responses API over a chat-completions upstream (``dialects/responses/over_chat``):
requests converted, answers and their events in the shapes the OpenAI SDK's own types
take (validated against them), and read by the Responses watch as an upstream's are."""

from __future__ import annotations

import itertools
import json
import typing
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent

from gateway.dialects.responses.over_chat import (
    EventsFromChat,
    chat_body,
    response_from_completion,
)
from gateway.dialects.responses.watch import ResponsesWatch
from gateway.errors import InvalidRequest
from gateway.upstream.sse import SSEDecoder

# The SDK's event type of each kind ("response.completed": ResponseCompletedEvent...).
EVENTS = {
    kind.model_fields["type"].annotation.__args__[0]: kind
    for kind in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}
TOOL = {"type": "function", "name": "get_weather", "description": "the weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip
USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
         "prompt_tokens_details": {"cached_tokens": 8}}  # fmt: skip


def ids() -> Any:
    counter = itertools.count()
    return lambda prefix: f"{prefix}_{next(counter)}"


# -- requests


def test_a_request_becomes_a_chat_request_with_its_context() -> None:
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": "ignored: the context is memory's",
        "tools": [TOOL],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 50,
        "temperature": 0.2,
        "top_p": 0.9,
        "parallel_tool_calls": False,
        "stream": True,
        "store": True,
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
    }
    context = [
        {"role": "system", "content": "Memory: teal."},
        {"role": "developer", "content": "dev"},
        {"role": "assistant", "content": None},  # a reference memory could not resolve
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    assert chat_body(body, context) == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief.\n\nMemory: teal."},
            {"role": "system", "content": "dev"},
            {"role": "user", "content": "hi"},
        ],
        "tools": [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}],
        "parallel_tool_calls": False,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 50,
        "temperature": 0.2,
        "top_p": 0.9,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}},
        },
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_instructions_come_first_when_the_context_has_no_system_message() -> None:
    body = {"model": "m", "instructions": "Be brief.", "input": "x"}
    messages = chat_body(body, [{"role": "user", "content": "hi"}])["messages"]
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert "stream" not in chat_body(body, [])


def test_content_of_text_parts_alone_is_one_string_others_are_kept() -> None:
    # llama-cpp-python's chat templates add content to a string: a list of parts is a 500.
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    context = [
        {"role": "user", "content": [{"type": "text", "text": "My seat"},
                                     {"type": "text", "text": "is 14C."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Noted."}]},
        {"role": "user", "content": [{"type": "text", "text": "And this?"}, image]},
    ]  # fmt: skip
    messages = chat_body({"model": "m"}, context)["messages"]
    assert [m["content"] for m in messages] == [
        "My seat\nis 14C.", "Noted.", [{"type": "text", "text": "And this?"}, image]
    ]  # fmt: skip


def test_a_part_chat_does_not_take_is_shaped_as_the_chat_route_shapes_it() -> None:
    # Memory may hold a Responses-only part (a file by id); a chat upstream would refuse it.
    parts = [{"type": "text", "text": "see"}, {"type": "input_file", "file_id": "file-1"}]
    context = [{"role": "user", "content": parts}]
    (message,) = chat_body({"model": "m"}, context)["messages"]
    assert message["content"] == [
        {"type": "text", "text": "see"}, {"type": "text", "text": "[input_file file-1]"}
    ]  # fmt: skip


def test_a_built_in_tool_is_refused_naming_it() -> None:
    body = {"model": "m", "input": "x", "tools": [TOOL, {"type": "web_search"}]}
    with pytest.raises(InvalidRequest) as raised:
        chat_body(body, [])
    assert raised.value.param == "tools.1.type"


# -- whole answers


def completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "served-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": USAGE,
    }


def test_a_whole_text_answer_is_a_completed_response() -> None:
    request = {"model": "m", "input": "hi", "instructions": "Be brief.", "tools": [TOOL]}
    answer = completion({"role": "assistant", "content": "Hello."})
    response = response_from_completion(answer, request, ids=ids())
    Response.model_validate(response)  # the SDK's own type takes it
    assert response["id"] == "resp_0" and response["status"] == "completed"
    assert response["model"] == "served-model" and response["created_at"] == 1700000000
    assert response["instructions"] == "Be brief." and response["tools"] == [TOOL]
    assert response["output"] == [
        {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello.", "annotations": []}]}
    ]  # fmt: skip
    assert response["usage"] == {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }


def test_function_calls_are_function_call_items() -> None:
    calls = [
        {"id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "call_b", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
    ]  # fmt: skip
    answer = completion({"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls")
    response = response_from_completion(answer, {"model": "m", "input": "x"}, ids=ids())
    Response.model_validate(response)
    assert response["status"] == "completed"
    assert [(i["type"], i["call_id"], i["name"], i["arguments"]) for i in response["output"]] == [
        ("function_call", "call_a", "get_weather", '{"city":"Paris"}'),
        ("function_call", "call_b", "get_weather", '{"city":"Oslo"}'),
    ]


def test_an_answer_cut_short_is_incomplete_and_no_answer_is_failed() -> None:
    cut = completion({"role": "assistant", "content": "Hel"}, "length")
    response = response_from_completion(cut, {"model": "m", "input": "x"})
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    failed = response_from_completion({"choices": []}, {"model": "m", "input": "x"})
    Response.model_validate(failed)
    assert failed["status"] == "failed" and failed["output"] == []


# -- streams


def sse(*payloads: Any) -> bytes:
    return b"".join(
        b"data: " + (p if isinstance(p, bytes) else json.dumps(p).encode()) + b"\n\n"
        for p in payloads
    )


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "served",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip


TEXT_STREAM = sse(
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo."}),
    chunk({}, "stop"),
    {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": USAGE},
    b"[DONE]",
)
CALL_STREAM = sse(
    chunk({"role": "assistant", "content": ""}),
    chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                           "function": {"name": "get_weather", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
    chunk({}, "tool_calls"),
    b"[DONE]",
)  # fmt: skip


def convert(stream: bytes, piece: int = 7, *, close: bool = True) -> bytes:
    """The stream fed in ``piece``-byte chunks (an event split anywhere), then closed."""
    events = EventsFromChat({"model": "m", "input": "x"}, ids=ids())
    out = b"".join(events.feed(stream[i : i + piece]) for i in range(0, len(stream), piece))
    return out + (events.close() if close else b"")


def decoded(stream: bytes) -> list[dict[str, Any]]:
    events = [json.loads(e.data) for e in SSEDecoder().feed(stream)]
    for event in events:
        EVENTS[event["type"]].model_validate(event)  # each one the SDK's type of its kind
    return events


def watched(stream: bytes) -> ResponsesWatch:
    watch = ResponsesWatch()
    watch.feed(stream)
    watch.close()
    return watch


@pytest.mark.parametrize("piece", [1, 7, 10_000])
def test_a_streamed_text_answer_is_the_responses_events_in_order(piece: int) -> None:
    out = convert(TEXT_STREAM, piece)
    events = decoded(out)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["delta"] for e in events if e["type"].endswith(".delta")] == ["Hel", "lo."]
    assert events[6]["text"] == "Hello."
    response = events[-1]["response"]
    Response.model_validate(response)
    assert response["status"] == "completed" and response["model"] == "served"
    assert response["output"][0]["content"][0]["text"] == "Hello."
    assert response["usage"]["input_tokens"] == 12
    assert (
        {e["item_id"] for e in events[3:8]}
        == {events[8]["item"]["id"]}
        == {response["output"][0]["id"]}
    )
    # The Responses watch reads it as an upstream's, and would record it.
    watch = watched(out)
    assert watch.done and watch.recordable
    assert watch.message().content == "Hello."
    assert watch.usage["prompt_tokens"] == 12


def test_a_streamed_function_call_is_its_item_and_argument_events() -> None:
    events = decoded(convert(CALL_STREAM))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = events[2]["item"]
    assert (added["type"], added["call_id"]) == ("function_call", "call_a")
    assert added["name"] == "get_weather"
    assert events[5]["arguments"] == '{"city":"Paris"}'
    output = events[-1]["response"]["output"]
    assert [(i["call_id"], i["arguments"]) for i in output] == [("call_a", '{"city":"Paris"}')]
    message = watched(convert(CALL_STREAM)).message()
    assert message.tool_calls == (
        {"id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
    )  # fmt: skip


def test_a_finish_without_done_completes_at_the_close_and_no_finish_does_not() -> None:
    no_done = TEXT_STREAM.replace(b"data: [DONE]\n\n", b"")
    assert decoded(convert(no_done, close=False))[-1]["type"] != "response.completed"
    assert decoded(convert(no_done))[-1]["type"] == "response.completed"
    cut = sse(chunk({"content": "Hel"}))
    watch = watched(convert(cut))
    assert not watch.ended  # the relay ends it with its own error (stream incomplete)


def test_an_error_chunk_or_a_malformed_one_ends_with_an_error_event_never_completed() -> None:
    error = sse(chunk({"content": "Hel"}), {"error": {"message": "boom", "code": "overloaded"}})
    events = decoded(convert(error))
    assert events[-1]["type"] == "error" and events[-1]["code"] == "overloaded"
    assert events[-1]["sequence_number"] == len(events) - 1
    watch = watched(convert(error))
    assert watch.ended and not watch.done and not watch.recordable
    malformed = TEXT_STREAM.replace(b'"content": "lo."', b'"content": "lo.')
    events = decoded(convert(malformed))
    assert events[-1]["type"] == "error" and "completed" not in str([e["type"] for e in events])
    assert not watched(convert(malformed)).recordable


def test_an_answer_cut_short_streams_as_incomplete_and_is_recorded() -> None:
    cut = sse(chunk({"content": "Hel"}), chunk({}, "length"), b"[DONE]")
    events = decoded(convert(cut))
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    watch = watched(convert(cut))
    assert watch.ended and watch.recordable and watch.message().content == "Hel"
