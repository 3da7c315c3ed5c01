"""The bound on what one request writes at once (``memory.max_record_bytes``)."""

from __future__ import annotations

import pytest

from gateway.errors import PayloadTooLarge
from gateway.memory.model import Message
from gateway.service.recording import check_record_size, record_batches, record_bytes


def messages(*sizes: int) -> list[Message]:
    return [Message("user", "é" * (size // 2)) for size in sizes]  # 2 bytes a character


def test_bytes_are_utf8_bytes_of_the_text() -> None:
    assert record_bytes(messages(10, 20)) == 30
    assert record_bytes([]) == 0


def test_tool_calls_count_their_names_and_arguments() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "x" * 99}}
    assert record_bytes([Message("assistant", None, tool_calls=(call, call))]) == 200


def test_a_turn_at_the_bound_is_taken_and_one_byte_more_refused() -> None:
    check_record_size(messages(60, 40), 100)
    with pytest.raises(PayloadTooLarge) as caught:
        check_record_size(messages(60, 42), 100)
    assert (caught.value.status, caught.value.param) == (413, "messages")
    assert "102 bytes" in caught.value.message


@pytest.mark.parametrize(
    ("sizes", "most_messages", "most_bytes", "expected"),
    [
        ((10, 10, 10), 500, 100, [3]),
        ((40, 40, 40), 500, 100, [2, 1]),  # bytes
        ((10, 10, 10, 10, 10), 2, 100, [2, 2, 1]),  # count
        ((200, 10, 10), 500, 100, [1, 2]),  # one message over the bound goes alone
        ((10, 200, 10), 500, 100, [1, 1, 1]),
        ((), 500, 100, []),
    ],
)
def test_batches_keep_order_and_both_bounds(
    sizes: tuple[int, ...], most_messages: int, most_bytes: int, expected: list[int]
) -> None:
    made = messages(*sizes)
    batches = list(record_batches(made, most_messages, most_bytes))
    assert [len(batch) for batch in batches] == expected
    assert [m for batch in batches for m in batch] == made
