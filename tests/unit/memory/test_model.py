"""Stored messages: their stored form and its parse."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessage

from gateway.dialects.chat.accumulate import StreamAccumulator, message_from_completion
from gateway.memory.model import Message, SessionState
from gateway.memory.reconcile import reconcile


def test_a_stored_message_parses_back_with_its_place() -> None:
    message = Message("assistant", "hi", ({"id": "c1", "type": "function"},), None, None, 0, 3, 1.5)
    raw = message.to_json()
    parsed = Message.from_json(raw, 7)
    assert parsed == Message("assistant", "hi", ({"id": "c1", "type": "function"},), None,
                             None, 7, 3, 1.5)  # fmt: skip
    assert Message.from_json(raw, 8).index == 8


def test_a_parse_is_not_kept_by_the_message_itself() -> None:
    # What is kept is the store's (tests/unit/store/test_parsed_messages.py): nothing
    # process-wide remembers a parse.
    raw = Message("user", "remember me", tokens=4).to_json()
    first, second = Message.from_json(raw, 1), Message.from_json(raw, 1)
    assert first == second and first is not second


def test_a_stored_message_read_as_json_is_the_same_message() -> None:
    message = Message("tool", "42", None, "call-1", "calc", 0, 2, 3.0)
    assert Message.from_data(json.loads(message.to_json()), 5) == message.but(index=5)
    assert Message.from_data({"role": "user"}, 1) == Message("user", index=1)


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


def test_a_recalled_line_s_count_is_stored_with_its_message_and_goes_with_its_content() -> None:
    message = Message("user", "hi", index=2, tokens=3, ts=1.0, line_tokens=5)
    raw = json.loads(message.to_json())
    assert raw["line_tokens"] == 5
    assert Message.from_data(raw, 2) == message
    assert message.but(tokens=4, index=3).line_tokens == 5  # bookkeeping: the line is the same
    assert message.but(line_tokens=0).line_tokens == 0
    assert message.with_content("another text").line_tokens == 0  # another line: not known
    assert "line_tokens" not in json.loads(message.but(line_tokens=0).to_json())  # no bytes


# --- A refused answer, as a client sends it back -------------------------------------

REFUSAL = "I can't help with that."
# The OpenAI SDK's refused answer, appended to a history as returned.
SDK_REFUSED = ChatCompletionMessage(role="assistant", content=None, refusal=REFUSAL).model_dump()


@pytest.mark.parametrize(
    ("data", "content"),
    [
        pytest.param(SDK_REFUSED, [{"type": "refusal", "refusal": REFUSAL}], id="refusal only"),
        pytest.param({"role": "assistant", "refusal": "No."},
                     [{"type": "refusal", "refusal": "No."}], id="content missing"),
        pytest.param({"role": "assistant", "content": "Hm.", "refusal": "No."},
                     [{"type": "text", "text": "Hm."}, {"type": "refusal", "refusal": "No."}],
                     id="text first"),
        pytest.param({"role": "assistant", "content": [{"type": "text", "text": "Hm."}],
                      "refusal": "No."},
                     [{"type": "text", "text": "Hm."}, {"type": "refusal", "refusal": "No."}],
                     id="parts first"),
        pytest.param({"role": "assistant", "content": "Hm.", "refusal": None}, "Hm.",
                     id="no refusal"),
        # Only an assistant answers, and refuses: another role's field is not content.
        pytest.param({"role": "user", "content": "Hm.", "refusal": "No."}, "Hm.", id="user"),
    ],
)  # fmt: skip
def test_a_refusal_is_kept_as_a_refusal_part(data: dict[str, Any], content: Any) -> None:
    message = Message.from_openai(data)
    assert message.content == content
    # Stored and read back as it is.
    assert Message.from_json(message.to_json(), 1).content == content


def _stored_refusals() -> list[Message]:
    """A refused answer as the gateway stores the upstream's own: whole and streamed."""
    whole = {"role": "assistant", "content": None, "refusal": REFUSAL}
    body = {"choices": [{"index": 0, "message": whole, "finish_reason": "stop"}]}
    stream = StreamAccumulator()
    for delta in ({"role": "assistant", "content": ""}, {"refusal": REFUSAL[:5]},
                  {"refusal": REFUSAL[5:]}):  # fmt: skip
        stream.add(json.dumps({"choices": [{"index": 0, "delta": delta}]}))
    stream.add(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    stored = message_from_completion(body)
    assert stored is not None
    return [stored, stream.message()]


@pytest.mark.parametrize("stored", _stored_refusals(), ids=["whole", "streamed"])
def test_a_resent_refusal_is_the_stored_refused_answer(stored: Message) -> None:
    assert Message.from_openai(SDK_REFUSED).same_turn_as(stored)


def _session(*messages: Message) -> SessionState:
    tail = tuple(replace(m, index=i + 1, tokens=5) for i, m in enumerate(messages))
    return SessionState(message_count=len(tail), tail=tail, exists=True)


@pytest.mark.parametrize("stored", _stored_refusals(), ids=["whole", "streamed"])
def test_a_history_resent_after_a_refused_answer_lines_up_with_the_log(stored: Message) -> None:
    """The client's copy of the refused answer is the stored one: a resent history
    imports nothing again, and a turn the store missed after it is imported."""
    asked = Message("user", "how do I pick a lock?")
    client = Message.from_openai(SDK_REFUSED)
    state = _session(asked, stored)
    new = Message("user", "then tell me a joke")
    resent = reconcile([asked, client, new], state)
    assert resent.to_record == (new,)
    assert resent.expected_count is None  # no import, no branch, no regenerate
    # Turn 2 reached the client but not the store (Redis was down): it is imported.
    missed = [new, Message("assistant", "A joke.")]
    later = Message("user", "another one")
    caught_up = reconcile([asked, client, *missed, later], state)
    assert caught_up.to_record == (*missed, later)
