"""The answer's tokens on the access line: a short answer counted on the loop after the
response, a long one in the heavy-work pool and only in part."""

from __future__ import annotations

import threading

from gateway import offload
from gateway.memory.model import Message
from gateway.observability import request_log
from gateway.service.answer_tokens import COUNTED_CHARS, count_bounded, note_tokens_out
from gateway.text.tokens import TokenCounter

MODEL = "gpt-4o"


class Spy(TokenCounter):
    """A real counter that remembers which thread counted how much."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def count_text(self, text: str, model: str | None = None) -> int:
        self.calls.append((threading.current_thread().name, len(text)))
        return super().count_text(text, model)


def answer(text: str, arguments: str = "") -> Message:
    calls = None
    if arguments:
        calls = (
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}},
        )
    return Message(role="assistant", content=text, tool_calls=calls)


def test_an_answer_within_the_bound_is_counted_exactly() -> None:
    counter = TokenCounter()
    message = answer("the quick brown fox " * 1000, arguments='{"a": 1}')
    assert count_bounded(counter, message, MODEL) == (
        counter.count_payload(message.to_openai(), MODEL),
        False,
    )


def test_a_longer_answer_is_counted_in_part_and_extrapolated() -> None:
    counter = Spy()
    text = "the quick brown fox jumps. " * (4 * COUNTED_CHARS // 27)
    tokens, estimated = count_bounded(counter, answer(text, arguments="x" * 1000), MODEL)
    assert estimated
    assert sum(chars for _, chars in counter.calls) <= COUNTED_CHARS  # only a part counted
    exact = TokenCounter().count_text(text, MODEL) + TokenCounter().count_text("x" * 1000, MODEL)
    assert abs(tokens - exact) < exact * 0.02  # a uniform text: the part tells the whole


async def test_a_long_answer_is_counted_off_the_loop_and_the_line_waits_for_it() -> None:
    counter = Spy()
    entry, token = request_log.begin([], logged=True)
    try:
        note_tokens_out(counter, answer("lorem ipsum " * COUNTED_CHARS), MODEL)
        assert not counter.calls  # not now, and not on this thread
        assert entry.pending
        await request_log.settle(entry)
    finally:
        request_log.end(token)
    assert entry.fields is not None
    assert entry.fields["tokens_out_estimated"] is True
    assert entry.fields["tokens_out"] > COUNTED_CHARS // 8
    loop_thread = threading.current_thread().name
    assert counter.calls and all(thread != loop_thread for thread, _ in counter.calls)


async def test_a_short_answer_is_counted_when_the_response_is_over() -> None:
    counter = Spy()
    entry, token = request_log.begin([], logged=True)
    try:
        note_tokens_out(counter, answer("fine, thanks"), MODEL)
        assert not counter.calls and not entry.pending
        assert entry.after is not None
        for work in entry.after:
            work()
    finally:
        request_log.end(token)
    assert entry.fields == {"tokens_out": TokenCounter().count_text("fine, thanks", MODEL)}
    assert counter.calls == [(threading.current_thread().name, len("fine, thanks"))]
    assert len("fine, thanks") < offload.HEAVY_CHARS
