"""``item_reference``s resolved against the stored log: gateway/memory/references.py, and
reconciliation of a history sent with them (the Vercel AI SDK's, issue 34)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.dialects.responses.items import messages_from_input
from gateway.memory.model import Message, OutputItem, SessionState
from gateway.memory.reconcile import reconcile
from gateway.memory.references import is_reference, reference, resolve

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def u(text: str) -> Message:
    return Message(role="user", content=text)


def answer(text: str | None, *items: OutputItem, calls: bool = False) -> Message:
    """A recorded answer with the upstream's output items."""
    return Message(
        role="assistant", content=text, tool_calls=(CALL,) if calls else None, output_items=items
    )


def msg(item_id: str) -> OutputItem:
    return (item_id, "message", "")


RS, FC = ("rs_1", "reasoning", ""), ("fc_1", "function_call", "call_1")


def stored(*messages: Message, first: int = 1) -> tuple[Message, ...]:
    return tuple(replace(m, index=first + i, tokens=5) for i, m in enumerate(messages))


def test_a_history_without_references_is_left_as_it_is() -> None:
    messages = (u("hi"), Message(role="assistant", content="hello"), u("again"))
    assert resolve(messages, stored(u("hi"))) == (messages, frozenset())


@pytest.mark.parametrize(
    ("sent", "tail"),
    [
        # A message item: the stored answer itself (its index, count and items).
        ([reference("msg_1")], [answer("hello", msg("msg_1"))]),
        # Its reasoning then its message (the SDK with a reasoning model): one message.
        ([reference("rs_1"), reference("msg_1")], [answer("hello", RS, msg("msg_1"))]),
        # Text by reference, its call in full (the SDK sends function calls whole).
        (
            [reference("msg_1"), Message(role="assistant", tool_calls=(CALL,))],
            [answer("let me look", msg("msg_1"), FC, calls=True)],
        ),
        # Reasoning by reference, the call in full.
        (
            [reference("rs_1"), Message(role="assistant", tool_calls=(CALL,))],
            [answer(None, RS, FC, calls=True)],
        ),
        # Both by reference (the SDK's older versions).
        (
            [reference("msg_1"), reference("fc_1")],
            [answer("let me look", msg("msg_1"), FC, calls=True)],
        ),
        # An answer of two message items: its text once.
        (
            [reference("msg_1"), reference("msg_2")],
            [answer("onetwo", msg("msg_1"), msg("msg_2"))],
        ),
    ],
)
def test_references_to_one_answer_make_the_stored_answer(
    sent: list[Message], tail: list[Message]
) -> None:
    loaded = stored(u("q"), *tail)
    messages, resolved = resolve([u("q"), *sent], loaded)
    assert messages == (u("q"), loaded[1])
    assert resolved == {m.output_items[0][0] for m in sent if is_reference(m)}


def test_a_reference_to_a_call_is_answered_by_the_output_after_it() -> None:
    loaded = stored(u("q"), answer(None, FC, calls=True))
    output = Message(role="tool", content="sunny", tool_call_id="call_1")
    messages, resolved = resolve([u("q"), reference("fc_1"), output], loaded)
    assert messages == (u("q"), loaded[1], output) and resolved == {"fc_1"}


def test_an_unknown_reference_is_left_out_and_forwarded() -> None:
    loaded = stored(u("q"), answer("a", msg("msg_1")))
    messages, resolved = resolve([u("q"), reference("msg_1"), reference("msg_x"), u("n")], loaded)
    assert messages == (u("q"), loaded[1], u("n"))
    assert resolved == {"msg_1"}  # msg_x goes to the upstream, which may hold it


def test_an_unknown_reference_before_the_loaded_tail_is_memorys() -> None:
    # A log longer than its loaded tail: a reference before the first resolved one names
    # an older answer of this conversation (held by memory), not one to forward.
    sent = [u("q0"), reference("msg_0"), u("q"), reference("msg_1"), u("n")]
    late = stored(u("q"), answer("a", msg("msg_1")), first=41)
    assert resolve(sent, late)[1] == {"msg_0", "msg_1"}
    # A log loaded whole: the earlier reference is the upstream's (a conversation begun
    # before the gateway), forwarded.
    whole = stored(u("q"), answer("a", msg("msg_1")))
    assert resolve(sent, whole)[1] == {"msg_1"}


def test_a_reference_stands_in_the_input_until_resolved() -> None:
    converted = messages_from_input(
        [
            {"role": "user", "content": "q"},
            {"type": "item_reference", "id": "msg_1"},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
            {"role": "user", "content": "n"},
        ]
    )
    first, ref, call, last = converted.messages
    assert is_reference(ref) and ref.output_items == (("msg_1", "item_reference", ""),)
    # The call did not join what came before the reference: it joins what it resolves to.
    assert call == Message(role="assistant", tool_calls=(CALL,))
    assert converted.origins == (0, 1, 2, 3)
    # Forwarded before the next message, unless resolved.
    assert converted.passengers == (
        (("call", "call_1"), ({"type": "item_reference", "id": "msg_1"},)),
    )
    assert not is_reference(first) and not is_reference(last)


def vercel_history(turns: int) -> list[dict[str, object]]:
    """The input the Vercel AI SDK sends on turn ``turns + 1`` (store: true)."""
    items: list[dict[str, object]] = []
    for n in range(turns):
        items.append({"role": "user", "content": [{"type": "input_text", "text": f"q{n}"}]})
        items.append({"type": "item_reference", "id": f"msg_{n}"})
    items.append({"role": "user", "content": [{"type": "input_text", "text": f"q{turns}"}]})
    return items


def test_a_history_of_references_reconciles_as_the_same_history_in_full() -> None:
    log: list[Message] = []
    for n in range(3):
        log += [
            Message(role="user", content=[{"type": "text", "text": f"q{n}"}]),
            answer(f"a{n}", msg(f"msg_{n}")),
        ]
    tail = stored(*log)
    session = SessionState(message_count=len(tail), tail=tail)
    plan = reconcile(messages_from_input(vercel_history(3)).messages, session)
    assert [m.text for m in plan.to_record] == ["q3"] and plan.prior == tail
    assert plan.resolved == {"msg_0", "msg_1", "msg_2"} and plan.expected_count is None
    full = [
        {"role": "assistant", "content": f"a{n}"} if item.get("type") else item
        for n, item in zip([0, 0, 1, 1, 2, 2, 3], vercel_history(3), strict=True)
    ]
    again = reconcile(messages_from_input(full).messages, session)
    assert replace(again, resolved=plan.resolved) == plan
