"""Which messages of a request are new: the rules of gateway/memory/reconcile.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gateway.memory.model import (
    Fact,
    Message,
    Pin,
    RollingSummary,
    SessionState,
    Summary,
    Tiers,
)
from gateway.memory.reconcile import Reconciled, reconcile


def u(text: str) -> Message:
    return Message(role="user", content=text)


def a(text: str | None, *call_ids: str) -> Message:
    calls = tuple(
        {"id": cid, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for cid in call_ids
    )
    return Message(role="assistant", content=text, tool_calls=calls or None)


def t(call_id: str, text: str = "result") -> Message:
    return Message(role="tool", content=text, tool_call_id=call_id)


def sys(text: str = "You are helpful.") -> Message:
    return Message(role="system", content=text)


def dev(text: str = "Be brief.") -> Message:
    return Message(role="developer", content=text)


def state(*messages: Message, count: int | None = None) -> SessionState:
    """A loaded session: ``messages`` is the stored tail, indexed to end at ``count``."""
    count = len(messages) if count is None else count
    first = count - len(messages) + 1
    tail = tuple(replace(m, index=first + i, tokens=5) for i, m in enumerate(messages))
    return SessionState(message_count=count, tail=tail)


def texts(messages: tuple[Message, ...]) -> list[tuple[str, Any]]:
    return [(m.role, m.content) for m in messages]


U1, A1, U2, A2, U3, A3, U4 = u("u1"), a("a1"), u("u2"), a("a2"), u("u3"), a("a3"), u("u4")


CASES: list[dict[str, Any]] = [
    dict(
        id="first turn",
        request=[U1],
        state=state(),
        to_record=[U1],
        new=[U1],
        prior=[],
    ),
    dict(
        id="first turn with system prompt",
        request=[sys(), U1],
        state=state(),
        to_record=[U1],
        new=[U1],
        prior=[],
        prompt=[sys()],
    ),
    dict(
        id="single-message client appends",
        request=[U3],
        state=state(U1, A1, U2, A2),
        to_record=[U3],
        new=[U3],
        prior=[U1, A1, U2, A2],
    ),
    dict(
        id="full history resend, stored tail matches",
        request=[U1, A1, U2, A2, U3],
        state=state(U1, A1, U2, A2),
        to_record=[U3],
        new=[U3],
        prior=[U1, A1, U2, A2],
    ),
    dict(
        id="full history resend against a partial tail",
        request=[U1, A1, U2, A2, U3],
        state=state(U2, A2, count=40),
        to_record=[U3],
        new=[U3],
        prior=[U2, A2],
    ),
    dict(
        id="history longer than stored: missed turn imported",
        request=[U1, A1, U2, A2, U3],
        state=state(U1, A1),
        to_record=[U2, A2, U3],
        new=[U3],
        prior=[U1, A1, U2, A2],
    ),
    dict(
        id="two missed turns imported",
        request=[U1, A1, U2, A2, U3, A3, U4],
        state=state(U1, A1),
        to_record=[U2, A2, U3, A3, U4],
        new=[U4],
        prior=[U1, A1, U2, A2, U3, A3],
    ),
    dict(
        id="empty store, history imported whole",
        request=[U1, A1, U2, A2, U3],
        state=state(),
        to_record=[U1, A1, U2, A2, U3],
        new=[U3],
        prior=[U1, A1, U2, A2],
    ),
    dict(
        id="diverged history: only new recorded",
        request=[U1, A1, U2, a("edited answer"), U3],
        state=state(U1, A1, U2, A2),
        to_record=[U3],
        new=[U3],
        prior=[U1, A1, U2, A2],
    ),
    dict(
        id="branched from an earlier point: only new recorded",
        request=[U1, A1, u("other question"), a("other answer"), U3],
        state=state(U1, A1, U2, A2),
        to_record=[U3],
        new=[U3],
        prior=[U1, A1, U2, A2],
    ),
    dict(
        id="single-message client repeating itself is a new turn",
        request=[u("continue")],
        state=state(U1, A1, u("continue"), A2),
        to_record=[u("continue")],
        new=[u("continue")],
        prior=[U1, A1, u("continue"), A2],
    ),
    dict(
        id="full history repeating the last question is a new turn",
        request=[U1, A1, U2, A2, U2],
        state=state(U1, A1, U2, A2),
        to_record=[U2],
        new=[U2],
        prior=[U1, A1, U2, A2],
    ),
    dict(
        id="tool results after stored tool call are new",
        request=[U1, a(None, "c1", "c2"), t("c1", "sunny"), t("c2", "12:00")],
        state=state(U1, a(None, "c1", "c2")),
        to_record=[t("c1", "sunny"), t("c2", "12:00")],
        new=[t("c1", "sunny"), t("c2", "12:00")],
        prior=[U1, a(None, "c1", "c2")],
    ),
    dict(
        id="single-message client sends tool results",
        request=[t("c1", "sunny")],
        state=state(U1, a(None, "c1")),
        to_record=[t("c1", "sunny")],
        new=[t("c1", "sunny")],
        prior=[U1, a(None, "c1")],
    ),
    dict(
        id="tool call with other id does not match",
        request=[U1, a(None, "other"), t("other")],
        state=state(U1, a(None, "c1")),
        to_record=[t("other")],
        new=[t("other")],
        prior=[U1, a(None, "c1")],
    ),
    dict(
        id="system and developer messages never recorded",
        request=[sys(), U1, A1, dev(), U2],
        state=state(U1, A1),
        to_record=[U2],
        new=[U2],
        prior=[U1, A1],
        prompt=[sys(), dev()],
    ),
    dict(
        id="system message mid-history does not break the match",
        request=[U1, A1, sys("late system"), U2, A2, U3],
        state=state(U1, A1),
        to_record=[U2, A2, U3],
        new=[U3],
        prior=[U1, A1, U2, A2],
        prompt=[sys("late system")],
    ),
    dict(
        id="resend ending with an assistant message adds nothing",
        request=[U1, A1, U2, A2],
        state=state(U1, A1, U2, A2),
        to_record=[],
        new=[],
        prior=[U1, A1, U2, A2],
    ),
    dict(
        id="content parts compare by text",
        request=[
            u("u1"),
            Message(role="assistant", content=[{"type": "text", "text": "a1"}]),
            U2,
        ],
        state=state(U1, A1),
        to_record=[U2],
        new=[U2],
        prior=[U1, A1],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_reconcile(case: dict[str, Any]) -> None:
    loaded: SessionState = case["state"]
    result = reconcile(case["request"], loaded)
    assert texts(result.to_record) == texts(tuple(case["to_record"]))
    assert texts(result.new) == texts(tuple(case["new"]))
    assert texts(result.prior) == texts(tuple(case["prior"]))
    assert result.prompt == tuple(case.get("prompt", ()))
    assert result.truncate_to is None
    # Only a plan that imports depends on the tail staying as it was loaded.
    imported = len(result.to_record) > len(result.new)
    assert result.expected_count == (loaded.message_count if imported else None)
    for message in result.to_record:
        assert message.role not in ("system", "developer")
        assert message.index == 0  # not stored yet
    # What was stored keeps its index, in order.
    stored_prior = result.prior[: len(loaded.tail)]
    assert stored_prior == loaded.tail


def test_tool_call_identity_is_part_of_a_match() -> None:
    # The stored assistant called c1; the client's history shows the same text calling c2.
    result = reconcile([U1, a("x", "c2"), U2], state(U1, a("x", "c1")))
    assert texts(result.to_record) == [("user", "u2")]


def test_new_messages_are_forwarded_with_client_fields() -> None:
    tool = Message(role="tool", content="42", tool_call_id="c1", tokens=9)
    result = reconcile([tool], state(U1, a(None, "c1")))
    assert result.new == (tool,)
    assert result.to_record == (tool,)


# --- regenerate ---------------------------------------------------------------------------


def test_regenerate_last_turn_with_full_history() -> None:
    loaded = state(U1, A1, U2, A2)
    result = reconcile([sys(), U1, A1, U2], loaded)
    assert result == Reconciled(
        prompt=(sys(),),
        prior=loaded.tail[:2],
        to_record=(),
        new=loaded.tail[2:3],
        truncate_to=3,
        expected_count=4,
    )
    assert result.new[0].index == 3
    assert result.truncate_to == loaded.message_count - 1


def test_regenerate_against_a_partial_tail() -> None:
    loaded = state(U1, A1, U2, A2, count=50)  # indexes 47..50
    result = reconcile([u("u0"), a("a0"), U1, A1, U2], loaded)
    assert result.truncate_to == 49
    assert [m.index for m in result.prior] == [47, 48]
    assert [m.index for m in result.new] == [49]
    assert result.to_record == ()
    assert result.expected_count == 50


def test_regenerate_of_the_very_first_turn() -> None:
    loaded = state(U1, A1)
    result = reconcile([U1], loaded)
    assert result.truncate_to == 1
    assert result.prior == ()
    assert result.to_record == ()
    assert result.new == loaded.tail[:1]
    assert result.expected_count == 2


def test_regenerate_of_tool_results_turn() -> None:
    call = a(None, "c1", "c2")
    loaded = state(U1, call, t("c1"), t("c2"), a("done"))
    result = reconcile([U1, call, t("c1"), t("c2")], loaded)
    assert result.truncate_to == 4
    assert texts(result.new) == texts((t("c1"), t("c2")))
    assert [m.index for m in result.new] == [3, 4]
    assert result.to_record == ()


@pytest.mark.parametrize(
    ("request_messages", "loaded"),
    [
        pytest.param([U2], state(U1, A1, U2, A2), id="single message mid-session"),
        pytest.param([U1, A1, u("u2 edited")], state(U1, A1, U2, A2), id="edited question"),
        pytest.param([U1, a("other"), U2], state(U1, A1, U2, A2), id="history differs"),
        pytest.param([U1], state(), id="empty store"),
    ],
)
def test_not_a_regenerate(request_messages: list[Message], loaded: SessionState) -> None:
    result = reconcile(request_messages, loaded)
    assert result.truncate_to is None
    assert result.to_record[-1:] == tuple(request_messages[-1:])


def test_a_stored_unanswered_turn_sent_again_is_a_retry_not_a_new_turn() -> None:
    stored = state(u("hello"), a("hi"), u("my seat is 14C"))
    request = (u("hello"), a("hi"), u("my seat is 14C"))
    for messages in (request, request[2:]):
        plan = reconcile(messages, stored)
        assert plan.to_record == () and plan.truncate_to is None
        assert [m.index for m in plan.new] == [3]
        assert [m.index for m in plan.prior] == [1, 2]


# --- edits: a new branch from the edited message -------------------------------------------

BUSINESS, ECONOMY = u("Book me a flight to Lisbon in business class"), u("... in economy class")


def test_edit_resent_up_to_the_edited_message_branches_there() -> None:
    loaded = state(U1, A1, BUSINESS, a("Booked: business"), U3, A3)
    result = reconcile([sys(), U1, A1, ECONOMY], loaded)
    assert result.branch_from == 2
    assert result.truncate_to is None
    assert texts(result.to_record) == texts((ECONOMY,))
    assert result.prior == loaded.tail[:2]
    assert texts(result.new) == texts((ECONOMY,))
    assert result.prompt == (sys(),)
    assert result.expected_count == 6  # the cut relies on the log as loaded


def test_edit_of_a_later_message_keeps_everything_before_it() -> None:
    loaded = state(U1, A1, U2, A2, U3, A3, U4, a("a4"))
    result = reconcile([U1, A1, U2, A2, U3, A3, u("u4 edited")], loaded)
    assert result.branch_from == 6
    assert [m.index for m in result.prior] == [1, 2, 3, 4, 5, 6]


def test_edit_against_a_partial_tail_needs_several_agreeing_messages() -> None:
    loaded = state(U1, A1, U2, A2, U3, A3, count=46)  # indexes 41..46
    older = [u("u0"), a("a0")]
    result = reconcile([*older, U1, A1, U2, A2, u("u3 edited")], loaded)
    assert result.branch_from == 44
    assert [m.index for m in result.prior] == [41, 42, 43, 44]
    assert texts(result.to_record) == [("user", "u3 edited")]
    # A sliding window ending at the edited message is the same evidence.
    window = reconcile([U1, A1, U2, A2, u("u3 edited")], loaded)
    assert window.branch_from == 44


def test_edit_inside_the_history_of_a_full_history_client() -> None:
    # The client edited u3 elsewhere, went on, and sends its whole conversation.
    loaded = state(U1, A1, U2, A2, U3, A3)
    result = reconcile([U1, A1, U2, A2, u("u3x"), a("a3x"), U4], loaded)
    assert result.branch_from == 4
    assert texts(result.to_record) == [("user", "u3x"), ("assistant", "a3x"), ("user", "u4")]
    assert texts(result.prior) == texts((U1, A1, U2, A2, u("u3x"), a("a3x")))
    assert texts(result.new) == [("user", "u4")]


def test_edit_branches_at_the_latest_place_the_history_lines_up() -> None:
    loaded = state(U1, A1, U2, A2, U1, A1, U2, A2, U3, A3)
    result = reconcile([U1, A1, U2, A2, U1, A1, U2, A2, u("u3 edited")], loaded)
    assert result.branch_from == 8


def test_edit_abandons_nothing_summaries_or_pins_came_from() -> None:
    loaded = state(U1, A1, U2, A2, U3, A3)
    request = [U1, A1, u("u2 edited")]
    assert reconcile(request, loaded).branch_from == 2
    summarized = replace(loaded, tiers=Tiers(summaries=(Summary(1, 4, "s"),)))
    rolling = replace(loaded, tiers=Tiers(rolling=RollingSummary("r", 1, 4)))
    pinned = replace(loaded, pins=(Pin("p", "seat 14C", 0.9, source_index=3),))
    for derived in (summarized, rolling, pinned):
        result = reconcile(request, derived)
        assert result.branch_from is None and result.truncate_to is None
        assert texts(result.prior) == texts(loaded.tail)  # today's rule: the store wins
    # Made from messages before the edit only: the edit stands.
    early = replace(loaded, tiers=Tiers(summaries=(Summary(1, 2, "s"),)))
    assert reconcile(request, early).branch_from == 2
    # Facts are redone after an edit (memory.branches), so they never stop one.
    facts = replace(loaded, tiers=Tiers(facts_end=6, facts=(Fact("my seat is 14C", 1, 6),)))
    assert reconcile(request, facts).branch_from == 2


@pytest.mark.parametrize(
    ("request_messages", "loaded"),
    [
        pytest.param([u("new")], state(U1, A1, U2, A2), id="single new message"),
        pytest.param([U2], state(U1, A1, U2, A2), id="single message repeating one stored"),
        pytest.param(
            [U2, A2, U3, A3, U4], state(U1, A1, U2, A2, U3, A3), id="sliding window at the end"
        ),
        pytest.param(
            [U2, A2, u("other")], state(U1, A1, U2, A2, U3, A3), id="short window mid-log"
        ),
        pytest.param([U1, A1, U2, A2, U3], state(U1, A1), id="missed turns imported"),
        pytest.param([U1, A1, U2], state(U1, A1, U2, A2), id="regenerate"),
        pytest.param([U1, A1, U2], state(U1, A1, U2), id="retry of an unanswered turn"),
        pytest.param([u("u1 edited")], state(U1, A1, U2, A2), id="edit of the very first message"),
        pytest.param(
            [U1, A1, U2, u("u3x")],
            state(U1, A1, U2, A2, U3, A3),
            id="history not ending with an answer",
        ),
        pytest.param(
            [U1, A1, U2, A2, U3, a("a3 edited"), U4],
            state(U1, A1, U2, A2, U3, A3),
            id="edited assistant message",
        ),
        pytest.param(
            [U1, A1, U2, A2, u("u3x")],
            state(U2, A2, U3, A3, count=44),
            id="edit before the loaded tail",
        ),
        pytest.param(
            [U1, A1, U2, A2, U3],
            state(u("ctx: u1"), A1, u("ctx: u2"), A2),
            id="client storing its questions bare",
        ),
        pytest.param(
            [U1, A1, u("u2 edited")],
            state(U1, a(None, "c1"), t("c1"), A1, U2),
            id="history skipping a tool exchange",
        ),
    ],
)
def test_not_an_edit(request_messages: list[Message], loaded: SessionState) -> None:
    result = reconcile(request_messages, loaded)
    assert result.branch_from is None
    # Nothing stored is dropped from the conversation (a regenerate replaces only its
    # answer, which the request does not have).
    kept = loaded.tail if result.truncate_to is None else loaded.tail[: result.truncate_to]
    assert (result.prior + result.new)[: len(kept)] == kept


def test_an_edit_abandons_only_messages_recorded_before_the_request() -> None:
    # Requests sent together with one history and different questions (a fan-out, two
    # tabs) look like edits of each other: a log that just grew is never abandoned.
    loaded = state(U1, A1, U2, A2)
    loaded = replace(loaded, tail=tuple(m.but(ts=100.0 + m.index) for m in loaded.tail))
    request = [U1, A1, u("u2 edited")]
    assert reconcile(request, loaded, edits_before=200.0).branch_from == 2
    assert reconcile(request, loaded, edits_before=104.0).branch_from is None
    assert reconcile(request, loaded, edits_before=None).branch_from is None
    same = reconcile(request, loaded, edits_before=None)
    assert same.prior == loaded.tail and texts(same.to_record) == [("user", "u2 edited")]
