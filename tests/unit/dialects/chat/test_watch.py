"""What the gateway may record of a stream it relays: only an answer it read whole."""

from __future__ import annotations

import json

import pytest

from gateway.dialects.chat.watch import StreamWatch, split_at_done
from gateway.upstream.sse import SSEDecoder, SSEEvent


def chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    data = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(data)}\n\n".encode()


HEAD = chunk("Hel") + chunk("lo")
END = chunk(finish="stop") + b"data: [DONE]\n\n"


def watched(*parts: bytes) -> StreamWatch:
    watch = StreamWatch()
    for part in parts:
        watch.feed(part)
    watch.close()
    return watch


@pytest.mark.parametrize(
    ("name", "parts", "recordable"),
    [
        ("clean", [HEAD, END], True),
        ("comments and non-field lines", [HEAD, b": ping\nnot a field\nid: 4\n\n", END], True),
        ("finish_reason without [DONE]", [HEAD, chunk(finish="stop")], True),
        ("broken JSON data", [HEAD, b"data: {not json\n\n", END], False),
        ("not UTF-8 outside any event", [HEAD, b"\xff\xfe garbage\n\n", END], False),
        ("not UTF-8 in content", [chunk("a")[:-10] + b"\xff" + chunk("a")[-10:], END], False),
        ("a line over the limit", [HEAD, b"data: " + b"x" * (2 << 20) + b"\n\n", END], False),
        ("an in-band error", [HEAD, b'data: {"error": {"message": "boom"}}\n\n'], False),
        ("no end at all", [HEAD], False),
    ],
)
def test_recordable(name: str, parts: list[bytes], recordable: bool) -> None:
    watch = watched(*parts)
    assert watch.recordable is recordable
    if recordable:
        assert watch.message().content == "Hello"


def test_ended_tells_a_clean_close_in_mid_answer_from_an_end() -> None:
    assert not watched(HEAD).ended
    assert watched(HEAD, chunk(finish="length")).ended
    assert watched(HEAD, b"data: [DONE]\n\n").ended
    assert watched(HEAD, b'data: {"error": {"message": "boom"}}\n\n').ended


def test_done_is_seen_when_its_chunk_arrives() -> None:
    watch = StreamWatch()
    watch.feed(HEAD + chunk(finish="stop"))
    assert not watch.done
    watch.feed(b"data: [DONE]\n\n")
    assert watch.done and watch.recordable


def test_an_over_long_line_is_dropped_without_being_held() -> None:
    decoder = SSEDecoder(max_event_chars=100)
    for _ in range(50):
        assert decoder.feed(b"y" * 64) == []
        assert len(decoder._buffer) <= 100 + 64  # never the whole line
    # The end of the long line and its event are dropped; the next event is intact.
    assert decoder.feed(b"\n\ndata: after\n\n") == [SSEEvent("after")]
    assert decoder.damaged


def test_many_data_lines_adding_up_to_too_much_drop_their_event() -> None:
    decoder = SSEDecoder(max_event_chars=100)
    events: list[SSEEvent] = []
    for _ in range(5):
        events += decoder.feed(b"data: " + b"z" * 40 + b"\n")
    events += decoder.feed(b"\ndata: next\n\n")
    assert events == [SSEEvent("next")]
    assert decoder.damaged


def test_a_character_split_across_chunks_is_not_damage() -> None:
    raw = "data: €\n\n".encode()
    decoder = SSEDecoder()
    assert decoder.feed(raw[:7]) == []
    assert decoder.feed(raw[7:]) == [SSEEvent("€")]
    assert not decoder.damaged


def test_invalid_utf8_is_noted_and_replaced_and_decoding_goes_on() -> None:
    euro = "€".encode()
    decoder = SSEDecoder()
    events = decoder.feed(b"data: a\xffb " + euro[:1])
    events += decoder.feed(euro[1:] + b"\n\n")
    assert events == [SSEEvent("a\ufffdb €")]
    assert decoder.damaged


CRLF_HEAD = HEAD.replace(b"\n", b"\r\n")
QUOTING = chunk("data: [DONE]")  # "[DONE]" inside an event's JSON is content, not the end


@pytest.mark.parametrize(
    ("chunk_", "before", "rest"),
    [
        (HEAD + END, HEAD + chunk(finish="stop"), b"data: [DONE]\n\n"),
        (b"data: [DONE]\n\n", b"", b"data: [DONE]\n\n"),
        (b"data:[DONE]\r\n\r\n", b"", b"data:[DONE]\r\n\r\n"),
        (CRLF_HEAD + b"data: [DONE]\r\n\r\n", CRLF_HEAD, b"data: [DONE]\r\n\r\n"),
        # [DONE] straddles chunks: its line does not start here, so all of it waits.
        (HEAD + b"data: [DO", b"", HEAD + b"data: [DO"),
        (b"NE]\n\n", b"", b"NE]\n\n"),
        (QUOTING + END, QUOTING + chunk(finish="stop"), b"data: [DONE]\n\n"),
    ],
)
def test_split_at_done_holds_back_only_the_done_line(
    chunk_: bytes, before: bytes, rest: bytes
) -> None:
    assert split_at_done(chunk_) == (before, rest)
