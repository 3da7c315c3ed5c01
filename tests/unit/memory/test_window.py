"""The verbatim window: newest whole units within a count and a token limit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.memory.model import Message
from gateway.memory.tiers.window import (
    newest_groups,
    newest_unit_list,
    without_unanswered_calls,
)


def newest_units(
    messages: Sequence[Message], *, max_messages: int, max_tokens: int | None = None
) -> tuple[Message, ...]:
    """The window's messages, oldest first."""
    chosen = newest_unit_list(messages, max_messages=max_messages, max_tokens=max_tokens)
    return tuple(m for group in reversed(chosen) for m in group)


def u(n: int, tokens: int = 10) -> Message:
    return Message(role="user", content=f"u{n}", index=n, tokens=tokens)


def a(n: int, tokens: int = 10, calls: tuple[str, ...] = ()) -> Message:
    tool_calls = tuple({"id": c, "type": "function", "function": {"name": "f"}} for c in calls)
    return Message(
        role="assistant", content=f"a{n}", index=n, tokens=tokens, tool_calls=tool_calls or None
    )


def t(n: int, call: str, tokens: int = 10) -> Message:
    return Message(role="tool", content=f"t{n}", index=n, tokens=tokens, tool_call_id=call)


def idx(messages: tuple[Message, ...] | list[Message]) -> list[int]:
    return [m.index for m in messages]


def tool_groups(messages: list[Message]) -> list[tuple[Message, ...]]:
    """The units in the messages' order (``newest_groups`` makes them newest first)."""
    return list(reversed(list(newest_groups(messages))))


# u1 a2 u3 A4(c1,c2) t5 t6 a7 u8 a9
CONVERSATION = [
    u(1),
    a(2),
    u(3),
    a(4, calls=("c1", "c2")),
    t(5, "c1"),
    t(6, "c2"),
    a(7),
    u(8),
    a(9),
]


def test_tool_groups() -> None:
    groups = tool_groups(CONVERSATION)
    assert [idx(g) for g in groups] == [[1], [2], [3], [4, 5, 6], [7], [8], [9]]


def test_tool_groups_orphan_results_form_one_unit() -> None:
    messages = [t(1, "c0"), t(2, "c0"), a(3), u(4)]
    assert [idx(g) for g in tool_groups(messages)] == [[1, 2], [3], [4]]


def test_tool_groups_call_without_results_is_a_unit() -> None:
    messages = [u(1), a(2, calls=("c1",))]
    assert [idx(g) for g in tool_groups(messages)] == [[1], [2]]


def test_tool_groups_consecutive_calls() -> None:
    messages = [a(1, calls=("c1",)), t(2, "c1"), a(3, calls=("c2",)), t(4, "c2"), a(5)]
    assert [idx(g) for g in tool_groups(messages)] == [[1, 2], [3, 4], [5]]


@pytest.mark.parametrize(
    ("max_messages", "max_tokens", "expected"),
    [
        pytest.param(100, None, [1, 2, 3, 4, 5, 6, 7, 8, 9], id="everything"),
        pytest.param(9, None, [1, 2, 3, 4, 5, 6, 7, 8, 9], id="exact count"),
        pytest.param(3, None, [7, 8, 9], id="count 3"),
        pytest.param(4, None, [7, 8, 9], id="count 4 cannot take half a unit"),
        pytest.param(5, None, [7, 8, 9], id="count 5 cannot take 2 of 3 tool messages"),
        pytest.param(6, None, [4, 5, 6, 7, 8, 9], id="count 6 takes the unit"),
        pytest.param(7, None, [3, 4, 5, 6, 7, 8, 9], id="count 7"),
        pytest.param(1, None, [9], id="count 1"),
        pytest.param(0, None, [], id="count 0"),
        pytest.param(100, 30, [7, 8, 9], id="tokens 30"),
        pytest.param(100, 59, [7, 8, 9], id="tokens 59 cannot take the 30-token unit"),
        pytest.param(100, 60, [4, 5, 6, 7, 8, 9], id="tokens 60"),
        pytest.param(100, 0, [], id="tokens 0"),
        pytest.param(7, 60, [4, 5, 6, 7, 8, 9], id="tokens bind before count"),
        pytest.param(4, 1000, [7, 8, 9], id="count binds before tokens"),
    ],
)
def test_newest_units(max_messages: int, max_tokens: int | None, expected: list[int]) -> None:
    window = newest_units(CONVERSATION, max_messages=max_messages, max_tokens=max_tokens)
    assert idx(window) == expected


def test_window_stops_at_first_unit_that_does_not_fit() -> None:
    # A big old message is not skipped to reach smaller, older ones: the window is a suffix.
    messages = [u(1, 1), a(2, 1), u(3, 500), a(4, 1)]
    assert idx(newest_units(messages, max_messages=10, max_tokens=100)) == [4]


def test_tokens_of_tool_messages_count_for_their_unit() -> None:
    messages = [u(1, 5), a(2, 5, calls=("c",)), t(3, "c", 100), u(4, 5)]
    assert idx(newest_units(messages, max_messages=10, max_tokens=109)) == [4]
    assert idx(newest_units(messages, max_messages=10, max_tokens=110)) == [2, 3, 4]


def test_window_never_starts_with_tool_results() -> None:
    # The tail was cut between a call and its results.
    messages = [t(5, "c1"), t(6, "c2"), a(7), u(8), a(9)]
    assert idx(newest_units(messages, max_messages=100)) == [7, 8, 9]


def test_window_of_only_orphan_results_is_empty() -> None:
    assert newest_units([t(1, "c"), t(2, "c")], max_messages=10) == ()


def test_empty_input() -> None:
    assert newest_units([], max_messages=10, max_tokens=10) == ()


def test_pending_call_at_the_end_is_kept_alone() -> None:
    messages = [u(1), a(2, calls=("c1",))]
    assert idx(newest_units(messages, max_messages=1)) == [2]


# --- property ------------------------------------------------------------------------------


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """Well-formed units, then possibly a cut prefix (the stored tail starts anywhere)."""
    messages: list[dict[str, Any]] = []
    for n in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "assistant", "tools"]))
        tokens = draw(st.integers(0, 60))
        if kind == "tools":
            ids = [f"c{n}_{i}" for i in range(draw(st.integers(1, 3)))]
            messages.append({"role": "assistant", "tokens": tokens, "calls": ids})
            for call_id in ids:
                messages.append({"role": "tool", "tokens": draw(st.integers(0, 60)), "id": call_id})
        else:
            messages.append({"role": kind, "tokens": tokens})
    cut = draw(st.integers(0, len(messages)))
    out = []
    for i, spec in enumerate(messages[cut:], start=1):
        calls = tuple({"id": c, "type": "function"} for c in spec.get("calls", ()))
        out.append(
            Message(
                role=spec["role"],
                content=f"m{i}",
                index=i,
                tokens=spec["tokens"],
                tool_calls=calls or None,
                tool_call_id=spec.get("id"),
            )
        )
    return out


@settings(max_examples=300, deadline=None)
@given(
    conversations(),
    st.integers(0, 20),
    st.one_of(st.none(), st.integers(0, 400)),
)
def test_window_properties(
    messages: list[Message], max_messages: int, max_tokens: int | None
) -> None:
    window = newest_units(messages, max_messages=max_messages, max_tokens=max_tokens)

    # (a) a suffix of whole units of the input, in order.
    units = tool_groups(messages)
    suffixes = [tuple(m for g in units[i:] for m in g) for i in range(len(units) + 1)]
    assert window in suffixes

    # (b) every tool message belongs to the assistant call right before its group.
    for position, message in enumerate(window):
        if message.role == "tool":
            head = position
            while window[head].role == "tool":
                head -= 1
                assert head >= 0, "tool results without their call"
            caller = window[head]
            assert caller.role == "assistant" and caller.tool_calls
            assert message.tool_call_id in {c["id"] for c in caller.tool_calls}

    # (c) limits respected.
    assert len(window) <= max_messages
    if max_tokens is not None:
        assert sum(m.tokens for m in window) <= max_tokens

    # Maximal: the next older unit would not fit (or the window is already everything).
    taken = [g for g in units if g and g[0] in window]
    older = units[: len(units) - len(taken)]
    if older and older[-1][0].role != "tool":
        nxt = older[-1]
        too_many = len(window) + len(nxt) > max_messages
        too_big = max_tokens is not None and (
            sum(m.tokens for m in window) + sum(m.tokens for m in nxt) > max_tokens
        )
        assert too_many or too_big


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(["user", "assistant", "call", "tool", "system"]), max_size=14).map(
        lambda roles: [_message(role, n) for n, role in enumerate(roles, start=1)]
    )
)
def test_units_follow_the_rule_read_forwards(messages: list[Message]) -> None:
    """Units are made newest first (a window of 8 reads only 8 of a 64-message tail): any
    sequence of roles, malformed ones included, must give the units of the rule read from
    the oldest message on (a tool result joins the unit before it when that unit's first
    message is a tool-calling assistant or a tool result)."""
    assert tool_groups(messages) == forward_units(messages)


def forward_units(messages: list[Message]) -> list[tuple[Message, ...]]:
    units: list[list[Message]] = []
    for message in messages:
        head = units[-1][0] if units else None
        open_call = head is not None and (
            (head.role == "assistant" and bool(head.tool_calls)) or head.role == "tool"
        )
        if message.role == "tool" and open_call:
            units[-1].append(message)
        else:
            units.append([message])
    return [tuple(unit) for unit in units]


def _message(role: str, n: int) -> Message:
    if role == "call":
        return a(n, calls=(f"c{n}",))
    if role == "tool":
        return t(n, f"c{n - 1}")
    return Message(role=role, content=f"m{n}", index=n)


def calls_of(unit: tuple[Message, ...]) -> list[str]:
    return [str(c["id"]) for m in unit for c in m.tool_calls or ()]


def test_a_call_is_forwarded_only_with_its_result() -> None:
    answered = (a(2, calls=("c1", "c2")), t(3, "c1"), t(4, "c2"))
    assert without_unanswered_calls(answered) == answered
    assert without_unanswered_calls((u(1),)) == (u(1),)
    # The user moved on: the calls were never run.
    unit = without_unanswered_calls((a(2, calls=("c1", "c2")),))
    assert idx(unit) == [2] and calls_of(unit) == [] and unit[0].text == "a2"
    silent = Message(
        role="assistant", content=None, index=5, tool_calls=a(5, calls=("c9",)).tool_calls
    )
    assert without_unanswered_calls((silent,)) == ()  # nothing left to forward
    # One of two parallel calls answered: only that one goes with its result.
    unit = without_unanswered_calls((a(2, calls=("c1", "c2")), t(3, "c2")))
    assert idx(unit) == [2, 3] and calls_of(unit) == ["c2"]
    # Results among the request's new messages answer the newest unit's calls.
    pending = (a(2, calls=("c1",)),)
    assert without_unanswered_calls(pending, frozenset({"c1"})) == pending
