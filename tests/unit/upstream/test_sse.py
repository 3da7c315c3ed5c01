"""The incremental SSE decoder: same events whatever the chunking."""

from __future__ import annotations

import pytest

from gateway.upstream.sse import SSEDecoder, SSEEvent


def decode(*chunks: bytes) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    events.extend(decoder.close())
    return events


CASES: list[tuple[str, bytes, list[SSEEvent]]] = [
    ("single event", b"data: hello\n\n", [SSEEvent("hello")]),
    ("crlf", b"data: a\r\n\r\ndata: b\r\n\r\n", [SSEEvent("a"), SSEEvent("b")]),
    ("cr only", b"data: a\r\rdata: b\r\r", [SSEEvent("a"), SSEEvent("b")]),
    ("mixed endings", b"data: a\r\n\ndata: b\n\r\n", [SSEEvent("a"), SSEEvent("b")]),
    ("no space after colon", b"data:x\n\n", [SSEEvent("x")]),
    ("only the first space is removed", b"data:  two\n\n", [SSEEvent(" two")]),
    ("multi-line data", b"data: one\ndata: two\ndata: three\n\n", [SSEEvent("one\ntwo\nthree")]),
    ("empty data line", b"data:\n\n", [SSEEvent("")]),
    ("bare data field", b"data\n\n", [SSEEvent("")]),
    ("empty line inside data", b"data: a\ndata:\ndata: b\n\n", [SSEEvent("a\n\nb")]),
    ("comment", b": keep-alive\n\ndata: x\n\n", [SSEEvent("x")]),
    ("comment without space", b":keep-alive\n\n", []),
    ("comment between data lines", b"data: a\n:ping\ndata: b\n\n", [SSEEvent("a\nb")]),
    ("event field", b"event: error\ndata: {}\n\n", [SSEEvent("{}", event="error")]),
    (
        "event type resets after dispatch",
        b"event: delta\ndata: 1\n\ndata: 2\n\n",
        [SSEEvent("1", event="delta"), SSEEvent("2")],
    ),
    (
        "event without data is not dispatched and resets",
        b"event: ping\n\ndata: x\n\n",
        [SSEEvent("x")],
    ),
    ("id and retry ignored", b"id: 7\nretry: 100\ndata: x\n\n", [SSEEvent("x")]),
    ("unknown field ignored", b"foo: bar\ndata: x\n\n", [SSEEvent("x")]),
    ("value keeps further colons", b"data: a: b:c\n\n", [SSEEvent("a: b:c")]),
    ("blank lines alone", b"\n\n\r\n\r\r", []),
    ("trailing incomplete event discarded", b"data: a\n\ndata: b\n", [SSEEvent("a")]),
    ("trailing partial line discarded", b"data: a\n\ndata: b", [SSEEvent("a")]),
    ("unicode", "data: héllo → 世界 🎉\n\n".encode(), [SSEEvent("héllo → 世界 🎉")]),
    (
        "openai stream",
        b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\ndata: [DONE]\n\n',
        [SSEEvent('{"choices":[{"delta":{"content":"Hi"}}]}'), SSEEvent("[DONE]")],
    ),
    ("invalid utf-8 replaced", b"data: a\xffb\n\n", [SSEEvent("a\ufffdb")]),
    ("blank line closed by a final cr", b"data: a\n\r", [SSEEvent("a")]),
]


@pytest.mark.parametrize(("stream", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_whole_stream(stream: bytes, expected: list[SSEEvent]) -> None:
    assert decode(stream) == expected


@pytest.mark.parametrize(("stream", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_split_at_every_byte(stream: bytes, expected: list[SSEEvent]) -> None:
    for split in range(len(stream) + 1):
        assert decode(stream[:split], stream[split:]) == expected, f"split at {split}"


@pytest.mark.parametrize(("stream", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_byte_at_a_time(stream: bytes, expected: list[SSEEvent]) -> None:
    assert decode(*(stream[i : i + 1] for i in range(len(stream)))) == expected


def test_events_are_returned_by_the_chunk_that_completes_them() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n") == []
    assert decoder.feed(b"\ndata: b\n\ndata: c") == [SSEEvent("a"), SSEEvent("b")]
    assert decoder.feed(b"\n\n") == [SSEEvent("c")]
    assert decoder.close() == []


def test_multibyte_character_split_across_chunks() -> None:
    raw = "data: €🎉\n\n".encode()
    euro = raw.index("€".encode())
    decoder = SSEDecoder()
    assert decoder.feed(raw[: euro + 1]) == []
    assert decoder.feed(raw[euro + 1 : euro + 2]) == []
    assert decoder.feed(raw[euro + 2 : euro + 5]) == []  # rest of € and half of 🎉
    assert decoder.feed(raw[euro + 5 :]) == [SSEEvent("€🎉")]


def test_cr_at_end_of_chunk_then_lf_is_one_line_ending() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n") == []  # the \r\n ends the data line only
    assert decoder.feed(b"data: b\r") == []
    assert decoder.feed(b"\n\r") == []
    # Had "\r" + "\n" counted as two line endings, "a" would have been dispatched alone.
    assert decoder.feed(b"\n") == [SSEEvent("a\nb")]


def test_cr_at_end_of_chunk_then_more_text_is_a_line_ending() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\r") == []  # held back: could still be \r\n
    assert decoder.feed(b"data: b\r\r") == [SSEEvent("a")]
    assert decoder.close() == [SSEEvent("b")]


def test_close_discards_an_unterminated_event() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: x\ndata: partial\n") == []
    assert decoder.close() == []


def test_close_after_clean_end_is_empty() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\n") == [SSEEvent("a")]
    assert decoder.close() == []
