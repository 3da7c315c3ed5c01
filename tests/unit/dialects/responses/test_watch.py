"""Watching a Responses event stream: recorded only on response.completed, read whole."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.dialects.events import split_at_last_event
from gateway.dialects.responses.watch import ResponsesWatch, split_at_completed
from gateway.memory.model import Message
from gateway.upstream.sse import SSEDecoder


def event(kind: str, number: int, **fields: Any) -> bytes:
    data = {"type": kind, "sequence_number": number, **fields}
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


ANSWER = [
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Hello", "annotations": []}],
    }
]
USAGE = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
HEAD = event("response.created", 0, response={"status": "in_progress", "output": []})
DELTAS = event("response.output_text.delta", 1, delta="Hel") + event(
    "response.output_text.delta", 2, delta="lo"
)
COMPLETED = event(
    "response.completed", 3, response={"status": "completed", "output": ANSWER, "usage": USAGE}
)


def watched(*parts: bytes) -> ResponsesWatch:
    watch = ResponsesWatch()
    for part in parts:
        watch.feed(part)
    watch.close()
    return watch


@pytest.mark.parametrize(
    ("name", "parts", "recordable", "ended"),
    [
        ("completed", [HEAD, DELTAS, COMPLETED], True, True),
        ("completed, then [DONE]", [HEAD, DELTAS, COMPLETED, b"data: [DONE]\n\n"], True, True),
        (
            "completed in bytes split anywhere",
            [(HEAD + DELTAS + COMPLETED)[:77], (HEAD + DELTAS + COMPLETED)[77:]],
            True,
            True,
        ),
        ("no completed event", [HEAD, DELTAS], False, False),
        ("failed", [HEAD, DELTAS, event("response.failed", 3, response={})], False, True),
        (
            "incomplete without output",
            [HEAD, event("response.incomplete", 1, response={})],
            False,
            True,
        ),
        (
            "cut short (incomplete) with its output",
            [HEAD, DELTAS, event("response.incomplete", 3, response={"output": ANSWER})],
            True,
            True,
        ),
        ("error", [HEAD, event("error", 1, code="x", message="boom")], False, True),
        ("broken JSON", [HEAD, b"data: {not json\n\n", DELTAS, COMPLETED], False, True),
        ("not UTF-8", [HEAD, b"\xff\xfe\n\n", COMPLETED], False, True),
        (
            "completed without output",
            [HEAD, event("response.completed", 1, response={})],
            False,
            True,
        ),
    ],
)
def test_what_is_recorded(name: str, parts: list[bytes], recordable: bool, ended: bool) -> None:
    watch = watched(*parts)
    assert watch.recordable is recordable, name
    assert watch.ended is ended, name


def test_the_answer_and_usage_come_from_the_completed_event() -> None:
    watch = watched(HEAD, DELTAS, COMPLETED)
    assert watch.done
    assert watch.message() == Message(role="assistant", content="Hello")
    assert watch.usage == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def test_what_was_relayed_is_counted_from_the_deltas_when_not_completed() -> None:
    watch = watched(HEAD, DELTAS)
    assert not watch.done
    assert watch.message() == Message(role="assistant", content="Hello")


def test_the_error_event_follows_the_last_sequence_number_and_the_sdk_shape() -> None:
    watch = watched(HEAD, DELTAS)
    (decoded,) = SSEDecoder().feed(watch.error_event("not stored", "memory_error", "nope"))
    assert decoded.event == "error"
    assert json.loads(decoded.data) == {
        "type": "error",
        "code": "nope",
        "message": "not stored",
        "param": None,
        "sequence_number": 3,
    }


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_split_holds_back_the_completed_event_only(newline: bytes) -> None:
    def lines(raw: bytes) -> bytes:
        return raw.replace(b"\n", newline)

    before, rest = split_at_completed(lines(DELTAS + COMPLETED))
    assert (before, rest) == (lines(DELTAS), lines(COMPLETED))
    data_only = b'data: {"type":"response.completed","sequence_number":3}\n\n'
    assert split_at_completed(lines(DELTAS + data_only)) == (lines(DELTAS), lines(data_only))


def test_split_holds_back_an_incomplete_event_as_a_completed_one() -> None:
    cut = event("response.incomplete", 3, response={"output": ANSWER})
    assert split_at_completed(DELTAS + cut) == (DELTAS, cut)


def test_split_ignores_the_words_in_an_answer() -> None:
    text = event("response.output_text.delta", 1, delta='say "type":"response.completed" now')
    assert split_at_completed(text + COMPLETED) == (text, COMPLETED)
    assert split_at_completed(text) == (b"", text)


def test_split_of_an_event_begun_in_an_earlier_chunk_holds_the_whole_chunk() -> None:
    tail = COMPLETED[10:]
    assert split_at_completed(tail) == (b"", tail)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_hold_keeps_back_an_event_not_ended_yet(newline: bytes) -> None:
    whole = (DELTAS + COMPLETED).replace(b"\n", newline)
    cut = len(DELTAS.replace(b"\n", newline)) + 30  # inside the completed event
    assert split_at_last_event(whole[:cut]) == (whole[: cut - 30], whole[cut - 30 : cut])
    assert split_at_last_event(whole) == (whole, b"")
    assert split_at_last_event(whole[5:20]) == (b"", whole[5:20])


def test_a_completed_event_in_many_chunks_is_relayed_only_whole() -> None:
    """The relay's loop over the watch (as ``MemoryProxy._relay`` runs it)."""
    stream = HEAD + DELTAS + COMPLETED
    watch, held, relayed, split = ResponsesWatch(), b"", [], None
    for at in range(0, len(stream), 40):
        chunk = stream[at : at + 40]
        watch.feed(chunk)
        chunk, held = held + chunk, b""
        if watch.done and split is None:
            split = watch.split(chunk)
            relayed.append(split[0])
            break
        chunk, held = watch.hold(chunk)
        relayed.append(chunk)
    assert split is not None and split[1] == COMPLETED
    assert b"".join(relayed) == HEAD + DELTAS
