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
