"""The Messages dialect against hostile input: an upstream's stream of the wrong shape, a
client's body the API refuses, and what another API stored going out in a shape the
Messages API takes."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gateway.dialects.anthropic.blocks import messages_from_anthropic, to_anthropic
from gateway.dialects.anthropic.request import parse_anthropic_request
from gateway.dialects.anthropic.watch import AnthropicWatch, whole_answer
from gateway.dialects.chat.request import Limits
from gateway.errors import InvalidRequest
from gateway.memory.model import Message
from tests.support.anthropic_events import CALL, START, STOP, delta, event, piece, text_block

TOOL_ID = re.compile(r"[a-zA-Z0-9_-]+")


TEXT = text_block("Seat 14C.")


def watched(*chunks: bytes) -> AnthropicWatch:
    watch = AnthropicWatch()
    for chunk in chunks:
        watch.feed(chunk)
    watch.close()
    return watch


@pytest.mark.parametrize(
    "stream",
    [
        event("message_start", message={"usage": "ab"}) + TEXT + delta("end_turn") + STOP,
        START + TEXT + event("message_delta", delta={"stop_reason": "end_turn"}, usage="xy") + STOP,
        START + TEXT.replace(b'"index": 0', b'"index": "x"') + delta("end_turn") + STOP,
        START + TEXT.replace(b'"index": 0', b'"index": 1e400') + delta("end_turn") + STOP,
        START + TEXT + delta(["end_turn"]) + STOP,
    ],
    ids=["usage", "delta usage", "index", "infinite index", "stop reason"],
)
def test_an_event_of_the_wrong_shape_is_malformed_never_an_exception(stream: bytes) -> None:
    # Raised in mid-stream, the relay died with a traceback, the client's stream cut.
    watch = watched(stream)
    assert watch.unreadable and not watch.recordable


@pytest.mark.parametrize(
    "stream",
    [
        START + TEXT + STOP,  # no message_delta
        START + TEXT + event("message_delta", delta={}, usage={"output_tokens": 3}) + STOP,
        START + CALL + piece('{"city": Pa') + delta("tool_use") + STOP,  # not JSON
        START + CALL + piece('["Paris"]') + delta("tool_use") + STOP,  # not an object
        START
        + event("content_block_start", index=0, content_block={"type": "tool_use", "name": "f"})
        + delta("tool_use")
        + STOP,  # a call with no id
    ],
    ids=["no delta", "no stop reason", "input not json", "input not an object", "call no id"],
)
def test_an_answer_that_cannot_be_read_whole_is_unreadable_not_quietly_unrecorded(
    stream: bytes,
) -> None:
    # Not recordable and not unreadable: message_stop went on, the client told its turn
    # was stored when it was not.
    watch = watched(stream)
    assert watch.done and watch.unreadable and not watch.recordable


@pytest.mark.parametrize("reason", ["model_context_window_exceeded", "a_reason_of_2027"])
def test_an_answer_that_stopped_for_any_reason_but_a_pause_is_recorded(reason: str) -> None:
    watch = watched(START + TEXT + delta(reason) + STOP)
    assert watch.recordable and watch.message() == Message(role="assistant", content="Seat 14C.")
    body = {"type": "message", "stop_reason": reason, "content": [{"type": "text", "text": "x"}]}
    assert whole_answer(body) == Message(role="assistant", content="x")


def test_a_text_block_started_with_text_keeps_it() -> None:
    # The SDKs show the client the start's text and the deltas after it: so is it stored.
    started = TEXT.replace(b'"text": ""', b'"text": "Your "', 1)
    watch = watched(START + started + delta("end_turn") + STOP)
    assert watch.message() == Message(role="assistant", content="Your Seat 14C.")


def test_a_pause_and_an_error_event_end_no_answer_and_no_misreading() -> None:
    paused = watched(START + TEXT + delta("pause_turn") + STOP)
    assert not paused.recordable and not paused.unreadable  # relayed, continued by the client
    error = event("error", error={"type": "overloaded_error", "message": "x"})
    failed = watched(START + CALL + piece('{"ci') + error)
    # The upstream's error event is the client's: no second error after it.
    assert failed.ended and not failed.recordable and not failed.unreadable


@pytest.mark.parametrize("reason", [["end_turn"], {"a": 1}, 7])
def test_a_whole_answer_with_a_stop_reason_that_is_not_a_string_is_none(reason: Any) -> None:
    body = {"type": "message", "stop_reason": reason, "content": [{"type": "text", "text": "x"}]}
    assert whole_answer(body) is None


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "user", "content": []}], "messages.0"),
        ([{"role": "user", "content": ""}], "messages.0"),
        ([{"role": "user", "content": " \n"}], "messages.0.content"),
        (
            [{"role": "user", "content": [{"type": "text", "text": ""}]}],
            "messages.0.content.0.text",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": []},
                {"role": "user", "content": "q2"},
            ],
            "messages.1",
        ),
        (
            [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}],
            "messages.0.content.0.type",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "document", "source": {}}]},
            ],
            "messages.1.content.0.type",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": [1]}],
                },
            ],
            "messages.1.content.0.input",
        ),
    ],
)
def test_what_the_api_refuses_is_refused_not_rewritten(messages: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        messages_from_anthropic(messages)
    assert refused.value.param == param


def test_a_final_empty_assistant_message_is_the_apis_to_judge() -> None:
    converted = messages_from_anthropic(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]
    )
    assert [m.role for m in converted.messages] == ["user", "assistant"]


def test_blank_chat_messages_go_out_as_nothing_and_no_placeholder() -> None:
    context: list[dict[str, Any]] = [
        {"role": "user", "content": "my seat is 14C"},
        {"role": "assistant", "content": [{"type": "text", "text": ""}]},
        {"role": "user", "content": "  "},
        {"role": "assistant", "content": " \n"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "\t"}, {"type": "text", "text": "ok?"}],
        },
    ]
    _, messages = to_anthropic(context)
    assert messages == [
        {"role": "user", "content": [
            {"type": "text", "text": "my seat is 14C"}, {"type": "text", "text": "ok?"}
        ]},
    ]  # fmt: skip


def call(call_id: str, name: str = "get_weather") -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": '{"city": "Paris"}'},
    }


def test_chat_tool_call_ids_go_out_as_ids_anthropic_takes_each_its_own() -> None:
    ids = ["functions.get_weather:0", "functions.get_weather_0", "toolu_kept-1", ""]
    context: list[dict[str, Any]] = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call(i) for i in ids]},
        *({"role": "tool", "tool_call_id": i, "content": "18C"} for i in ids),
    ]
    _, messages = to_anthropic(context)
    uses = [b["id"] for b in messages[1]["content"]]
    results = [b["tool_use_id"] for b in messages[2]["content"]]
    assert uses == results and len(set(uses)) == len(ids)
    assert all(TOOL_ID.fullmatch(i) for i in uses)
    assert uses[2] == "toolu_kept-1"  # an id Anthropic takes is left as it is


def test_a_custom_tool_call_goes_out_with_its_name_and_input() -> None:
    custom = {"id": "call_1", "type": "custom", "custom": {"name": "run", "input": "ls -l"}}
    context: list[dict[str, Any]] = [
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": None, "tool_calls": [custom]},
        {"role": "tool", "tool_call_id": "call_1", "content": ""},
    ]
    _, messages = to_anthropic(context)
    assert messages[1]["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "run", "input": {"input": "ls -l"}}
    ]
    # A blank result has no content (a blank text is refused; the field is optional).
    assert messages[2]["content"] == [{"type": "tool_result", "tool_use_id": "call_1"}]


def test_files_and_stored_images_go_out_as_blocks_anthropic_takes() -> None:
    content = [
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=",
                                  "filename": "a.pdf"}},
        {"type": "file", "file": {"file_data": "data:text/plain;base64,c2VhdCAxNEM="}},
        {"type": "file", "file": {"file_data": "data:application/msword;base64,AAAA",
                                  "filename": "b.doc"}},
        {"type": "file", "file": {"file_id": "file-123"}},
        {"type": "image_url", "image_url": {"url": "memory-gateway:media/" + "0" * 64}},
    ]  # fmt: skip
    _, messages = to_anthropic([{"role": "user", "content": content}])
    assert messages[0]["content"] == [
        {"type": "document",
         "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}},
        {"type": "document",
         "source": {"type": "text", "media_type": "text/plain", "data": "seat 14C"}},
        {"type": "text", "text": "[file b.doc]"},
        {"type": "text", "text": "[file]"},
        {"type": "text", "text": "[image]"},
    ]  # fmt: skip


def test_the_requests_own_cache_mark_is_one_of_the_four() -> None:
    system = [
        {"type": "text", "text": f"rule {i}", "cache_control": {"type": "ephemeral"}}
        for i in range(3)
    ]
    body = {
        "model": "claude-x",
        "max_tokens": 10,
        "system": system,
        "cache_control": {"type": "ephemeral"},
        "messages": [
            {"role": "user", "content": "my seat is 14C"},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "which seat?"},
        ],
    }
    request = parse_anthropic_request(json.dumps(body).encode(), Limits())
    context = [{"role": "system", "content": "[memory] seat 14C"}]
    context += [m.to_openai() for m in request.messages]
    sent = json.loads(request.forwarded(context))
    assert json.dumps(sent).count('"cache_control"') == 4


SCREENSHOT = {
    "type": "image",
    "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
}
NEWEST = [
    {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
     "content": [{"type": "text", "text": "partial"}, SCREENSHOT]},
    {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"},
     "citations": {"enabled": True}},
    {"type": "search_result", "source": "https://example.com", "title": "T",
     "content": [{"type": "text", "text": "seat 14C"}]},
    {"type": "text", "text": "what do you see?", "cache_control": {"type": "ephemeral"}},
]  # fmt: skip
LOOP = [
    {"role": "user", "content": "take a screenshot"},
    {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}
    ]},
    {"role": "user", "content": NEWEST},
]  # fmt: skip


def sent_with(context_of: Any) -> list[dict[str, Any]]:
    body = {"model": "claude-x", "max_tokens": 10, "messages": LOOP}
    request = parse_anthropic_request(json.dumps(body).encode(), Limits(), marks=False)
    context = context_of([m.to_openai() for m in request.messages])
    return list(json.loads(request.forwarded(context))["messages"])


def test_the_newest_message_goes_as_the_client_sent_it_not_as_memory_keeps_it() -> None:
    # Read back from memory: the screenshot "[image]" text, the error a plain result,
    # the document "[document]", the search result "[search_result]".
    recalled = {"role": "system", "content": "[recalled] an excerpt"}
    newest = sent_with(lambda context: [*context[:-1], recalled, context[-1]])[-1]["content"]
    assert (
        newest
        == [
            NEWEST[0],
            {"type": "text", "text": "[recalled] an excerpt"},  # memory's, before the message
            *NEWEST[1:3],
            {"type": "text", "text": "what do you see?"},  # the client's mark is not carried
        ]
    )


def test_memory_reading_stays_where_the_context_does_not_end_with_the_message() -> None:
    newest = sent_with(lambda context: [*context[:-1], {"role": "user", "content": "other"}])
    assert newest[-1]["content"][0] == NEWEST[0]  # its tool result, by its id
    assert newest[-1]["content"][1:] == [{"type": "text", "text": "other"}]


def test_a_stored_screenshot_goes_back_as_an_image_in_its_tool_result() -> None:
    context: list[dict[str, Any]] = [
        {"role": "user", "content": "take a screenshot"},
        {"role": "assistant", "content": None, "tool_calls": [call("toolu_1", "screenshot")]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": [
            {"type": "text", "text": "partial"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
        ]},
    ]  # fmt: skip
    _, messages = to_anthropic(context)
    assert messages[-1]["content"][0]["content"] == [
        {"type": "text", "text": "partial"},
        SCREENSHOT,
    ]


def test_an_assistants_image_or_file_goes_out_as_a_short_text() -> None:
    # Imported through the memory API, say: Anthropic takes neither from the assistant.
    content = [
        {"type": "text", "text": "here it is"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0="}},
    ]
    _, messages = to_anthropic([
        {"role": "user", "content": "draw it"},
        {"role": "assistant", "content": content},
        {"role": "user", "content": "thanks"},
    ])  # fmt: skip
    assert messages[1]["content"] == [
        {"type": "text", "text": "here it is"},
        {"type": "text", "text": "[image]"},
        {"type": "text", "text": "[document]"},
    ]
