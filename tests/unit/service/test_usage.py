"""The upstream's usage as the gateway reads it: prompt, cached and completion tokens,
whole or streamed, from both APIs; whatever is missing or malformed is unknown, never an
error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.dialects.chat.dialect import CHAT
from gateway.dialects.responses.dialect import RESPONSES
from gateway.service.usage import UNKNOWN, Usage, read_usage


def chat_chunk(**fields: Any) -> bytes:
    return f"data: {json.dumps({'id': 'c1', **fields})}\n\n".encode()


def chat_streamed(usage: Any) -> Any:
    """The usage a chat stream's watch read (``stream_options.include_usage``)."""
    watch = CHAT.watch()
    delta = {"index": 0, "delta": {"content": "hi"}, "finish_reason": None}
    finish = {"index": 0, "delta": {}, "finish_reason": "stop"}
    for part in (
        chat_chunk(choices=[delta]),
        chat_chunk(choices=[finish]),
        chat_chunk(choices=[], usage=usage),
        b"data: [DONE]\n\n",
    ):
        watch.feed(part)
    assert watch.done and watch.recordable
    return watch.usage


def responses_event(kind: str, number: int, **fields: Any) -> bytes:
    data = json.dumps({"type": kind, "sequence_number": number, **fields})
    return f"event: {kind}\ndata: {data}\n\n".encode()


def responses_streamed(usage: Any) -> Any:
    """The usage a Responses stream's watch read from ``response.completed``."""
    watch = RESPONSES.watch()
    output = [{"type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": "hi"}]}]  # fmt: skip
    response = {"status": "completed", "output": output, "usage": usage}
    watch.feed(responses_event("response.created", 0, response={"output": []}))
    watch.feed(responses_event("response.completed", 1, response=response))
    assert watch.done and watch.recordable
    return watch.usage


CHAT_USAGE = {"prompt_tokens": 2_000, "completion_tokens": 12, "total_tokens": 2_012,
              "prompt_tokens_details": {"cached_tokens": 1_792, "audio_tokens": 0}}  # fmt: skip
RESPONSES_USAGE = {"input_tokens": 2_000, "output_tokens": 12, "total_tokens": 2_012,
                   "input_tokens_details": {"cached_tokens": 1_792},
                   "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
READ = Usage(prompt_tokens=2_000, cached_tokens=1_792, completion_tokens=12)


@pytest.mark.parametrize(
    ("name", "usage"),
    [
        ("chat, whole", CHAT.usage({"choices": [], "usage": CHAT_USAGE})),
        ("chat, streamed", chat_streamed(CHAT_USAGE)),
        ("responses, whole", RESPONSES.usage({"status": "completed", "usage": RESPONSES_USAGE})),
        ("responses, streamed", responses_streamed(RESPONSES_USAGE)),
    ],
)
def test_cached_tokens_are_read_from_both_apis_whole_or_streamed(name: str, usage: Any) -> None:
    assert read_usage(usage) == READ, name


def test_a_stream_without_a_usage_chunk_has_none() -> None:
    watch = CHAT.watch()
    watch.feed(
        chat_chunk(choices=[{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}])
    )
    watch.feed(b"data: [DONE]\n\n")
    assert watch.recordable and read_usage(watch.usage) == UNKNOWN


def chat(**fields: Any) -> dict[str, Any]:
    return {"prompt_tokens": 100, "completion_tokens": 5, **fields}


@pytest.mark.parametrize(
    ("name", "usage", "expected"),
    [
        ("no usage", None, UNKNOWN),
        ("usage not an object", "lots", UNKNOWN),
        ("usage a list", [1, 2], UNKNOWN),
        ("no details", chat(), Usage(100, None, 5)),
        ("null details", chat(prompt_tokens_details=None), Usage(100, None, 5)),
        ("details not an object", chat(prompt_tokens_details=7), Usage(100, None, 5)),
        ("details without cached", chat(prompt_tokens_details={}), Usage(100, None, 5)),
        ("null cached", chat(prompt_tokens_details={"cached_tokens": None}), Usage(100, None, 5)),
        (
            "cached a string",
            chat(prompt_tokens_details={"cached_tokens": "64"}),
            Usage(100, None, 5),
        ),
        ("cached a float", chat(prompt_tokens_details={"cached_tokens": 6.5}), Usage(100, None, 5)),
        ("cached a bool", chat(prompt_tokens_details={"cached_tokens": True}), Usage(100, None, 5)),
        ("cached negative", chat(prompt_tokens_details={"cached_tokens": -1}), Usage(100, None, 5)),
        (
            "more cached than sent",
            chat(prompt_tokens_details={"cached_tokens": 101}),
            Usage(100, None, 5),
        ),
        ("cached of no prompt", {"prompt_tokens_details": {"cached_tokens": 10}}, UNKNOWN),
        ("all cached", chat(prompt_tokens_details={"cached_tokens": 100}), Usage(100, 100, 5)),
        ("none cached", chat(prompt_tokens_details={"cached_tokens": 0}), Usage(100, 0, 5)),
        ("prompt negative", chat(prompt_tokens=-3), Usage(None, None, 5)),
        ("prompt a bool", chat(prompt_tokens=False), Usage(None, None, 5)),
        ("completion a string", chat(completion_tokens="5"), Usage(100, None, None)),
    ],
)
def test_missing_or_malformed_counts_are_unknown(name: str, usage: Any, expected: Usage) -> None:
    assert read_usage(usage) == expected, name


@pytest.mark.parametrize(
    ("name", "usage", "expected"),
    [
        ("no details", {"input_tokens": 10, "output_tokens": 5}, Usage(10, None, 5)),
        ("null details", {"input_tokens": 10, "input_tokens_details": None}, Usage(10)),
        (
            "garbage cached",
            {"input_tokens": 10, "input_tokens_details": {"cached_tokens": "x"}},
            Usage(10),
        ),
        ("usage null", None, UNKNOWN),
    ],
)
def test_a_responses_usage_without_its_details_reads_as_unknown(
    name: str, usage: Any, expected: Usage
) -> None:
    assert read_usage(RESPONSES.usage({"usage": usage})) == expected, name
    assert read_usage(responses_streamed(usage)) == expected, name


def test_the_stored_shape_names_every_count() -> None:
    assert Usage(10, 6, 5).to_json() == {
        "prompt_tokens": 10, "cached_tokens": 6, "completion_tokens": 5,
    }  # fmt: skip
    assert UNKNOWN.to_json() == dict.fromkeys(
        ("prompt_tokens", "cached_tokens", "completion_tokens")
    )
