"""Stored messages: parsing, and the parse remembered by content."""

from __future__ import annotations

from gateway.memory.model import Message


def test_a_stored_message_parses_back_with_its_place() -> None:
    message = Message("assistant", "hi", ({"id": "c1", "type": "function"},), None, None, 0, 3, 1.5)
    raw = message.to_json()
    parsed = Message.from_json(raw, 7)
    assert parsed == Message("assistant", "hi", ({"id": "c1", "type": "function"},), None,
                             None, 7, 3, 1.5)  # fmt: skip
    assert Message.from_json(raw, 8).index == 8


def test_the_same_bytes_at_the_same_place_parse_once() -> None:
    raw = Message("user", "remember me", tokens=4).to_json()
    assert Message.from_json(raw, 1) is Message.from_json(bytes(raw), 1)
    assert Message.from_json(raw, 2) is not Message.from_json(raw, 1)
    # Other bytes are another message, however close.
    other = Message("user", "remember me!", tokens=4).to_json()
    assert Message.from_json(other, 1).content == "remember me!"


def test_a_large_message_is_parsed_every_time_not_kept() -> None:
    raw = Message("user", "x" * 10_000).to_json()
    first, second = Message.from_json(raw, 1), Message.from_json(raw, 1)
    assert first == second and first is not second


def test_a_copy_changes_only_the_bookkeeping_asked_for() -> None:
    calls = ({"id": "c1", "type": "function"},)
    message = Message("assistant", "hi", calls, "t1", "bot", 3, 12, 1.5)
    assert message.but(index=9) == Message("assistant", "hi", calls, "t1", "bot", 9, 12, 1.5)
    assert message.but(tokens=4) == Message("assistant", "hi", calls, "t1", "bot", 3, 4, 1.5)
    assert message.but(ts=2.0) == Message("assistant", "hi", calls, "t1", "bot", 3, 12, 2.0)
    # Zero is a value, not "unchanged": a copy may be unplaced or uncounted again.
    assert message.but(index=0, tokens=0, ts=0.0) == Message(
        "assistant", "hi", calls, "t1", "bot", 0, 0, 0.0
    )
    assert message.but() == message
