"""The Markdown export's ``Start:`` is when the conversation began (issue 34: it was the
time the session's record was made, so an imported conversation of last year "started"
at its import)."""

from __future__ import annotations

from datetime import UTC, datetime

from gateway.memory.model import Message, SessionState
from gateway.memory.session_markdown import session_markdown

IMPORTED_AT = datetime(2026, 11, 27, 6, 0, tzinfo=UTC).timestamp()
SAID_AT = datetime(2025, 3, 14, 9, 5, tzinfo=UTC).timestamp()


def start_line(meta: dict[str, str], messages: list[Message]) -> str:
    state = SessionState(message_count=len(messages), exists=True)
    text = session_markdown("s1", meta, state, messages, {"window": []})
    return next(line for line in text.splitlines() if line.startswith("- Start: "))


def message(index: int, ts: float) -> Message:
    return Message(role="user" if index % 2 else "assistant", content="hi", index=index, ts=ts)


def test_an_imported_conversation_starts_at_its_first_message() -> None:
    messages = [message(1, SAID_AT), message(2, SAID_AT + 60)]
    assert start_line({"created": str(IMPORTED_AT)}, messages) == "- Start: 2025-03-14T09:05:00Z"


def test_a_live_session_starts_when_its_record_was_made() -> None:
    # Its messages are recorded after the record is made: the record's time is the start.
    messages = [message(1, IMPORTED_AT + 1), message(2, IMPORTED_AT + 5)]
    assert start_line({"created": str(IMPORTED_AT)}, messages) == "- Start: 2026-11-27T06:00:00Z"
    # Messages without a time (ts 0) are not the start of anything.
    assert start_line({"created": str(IMPORTED_AT)}, [message(1, 0.0)]).endswith("06:00:00Z")
    assert start_line({}, []) == "- Start: (open)"
