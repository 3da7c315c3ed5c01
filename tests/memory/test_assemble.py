"""What is forwarded: prompt, window, new messages, within the budget; and the receipt."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.memory.assemble import Receipt, WindowLimits, assemble
from gateway.memory.model import Message
from gateway.memory.reconcile import Reconciled
from gateway.tokens import TOKENS_PER_REPLY


def m(role: str, n: int, tokens: int, **kwargs: Any) -> Message:
    return Message(role=role, content=f"{role}{n}", index=n, tokens=tokens, **kwargs)


def prior(n: int, tokens: int = 10) -> tuple[Message, ...]:
    """``n`` stored messages, user/assistant alternating, indexes 1..n."""
    return tuple(m("user" if i % 2 else "assistant", i, tokens) for i in range(1, n + 1))


SYSTEM = Message(role="system", content="be nice", tokens=7)
NEW = Message(role="user", content="question", tokens=20)


def turn(
    stored: tuple[Message, ...],
    new: tuple[Message, ...] = (NEW,),
    prompt: tuple[Message, ...] = (SYSTEM,),
) -> Reconciled:
    return Reconciled(prompt=prompt, prior=stored, to_record=new, new=new)


def limits(
    max_messages: int = 100, max_tokens: int | None = None, budget: int = 10_000
) -> WindowLimits:
    return WindowLimits(max_messages=max_messages, max_tokens=max_tokens, budget_tokens=budget)


def indexes(messages: tuple[Message, ...]) -> list[int]:
    return [msg.index for msg in messages]


def test_order_is_prompt_window_new() -> None:
    context = assemble(turn(prior(4)), limits())
    assert context.messages == (SYSTEM, *prior(4), NEW)
    assert context.openai_messages()[0] == {"role": "system", "content": "be nice"}
    assert context.openai_messages()[-1] == {"role": "user", "content": "question"}


@pytest.mark.parametrize(
    ("lim", "expected_window"),
    [
        pytest.param(limits(max_messages=3), [6, 7, 8], id="by count"),
        pytest.param(limits(max_tokens=50), [4, 5, 6, 7, 8], id="by window tokens"),
        # fixed = 7 + 20 + 3 = 30; room = 75 - 30 = 45 -> four 10-token messages
        pytest.param(limits(budget=75), [5, 6, 7, 8], id="by budget"),
        pytest.param(limits(budget=30 + 80), [1, 2, 3, 4, 5, 6, 7, 8], id="budget exactly fits"),
        pytest.param(limits(budget=30 + 79), [2, 3, 4, 5, 6, 7, 8], id="budget one short"),
        pytest.param(limits(max_tokens=20, budget=75), [7, 8], id="window cap under room"),
        pytest.param(limits(max_messages=2, budget=75), [7, 8], id="count under room"),
    ],
)
def test_window_shrinks_to_fit(lim: WindowLimits, expected_window: list[int]) -> None:
    context = assemble(turn(prior(8)), lim)
    assert context.messages[0] == SYSTEM
    assert context.messages[-1] == NEW
    assert indexes(context.messages[1:-1]) == expected_window
    assert context.receipt.window_indexes == tuple(expected_window)
    assert context.receipt.total_tokens <= lim.budget_tokens


@pytest.mark.parametrize("budget", [1, 29, 30])
def test_prompt_and_new_kept_even_over_budget(budget: int) -> None:
    big_new = Message(role="user", content="huge", tokens=5000)
    context = assemble(turn(prior(6), new=(big_new,)), limits(budget=budget))
    assert context.messages == (SYSTEM, big_new)
    assert context.receipt.tiers == {"prompt": 7, "window": 0, "new": 5000}
    assert context.receipt.window_indexes == ()
    assert context.receipt.total_tokens == 7 + 5000 + TOKENS_PER_REPLY


def test_window_does_not_split_tool_units() -> None:
    stored = (
        m("user", 1, 10),
        m("assistant", 2, 10, tool_calls=({"id": "c1"},)),
        m("tool", 3, 10, tool_call_id="c1"),
        m("assistant", 4, 10),
    )
    # room for 2 messages: the unit (2, 3) does not fit behind message 4 -> only 4.
    context = assemble(turn(stored), limits(budget=30 + 25))
    assert indexes(context.messages[1:-1]) == [4]
    context = assemble(turn(stored), limits(budget=30 + 30))
    assert indexes(context.messages[1:-1]) == [2, 3, 4]


def test_new_tool_results_keep_their_call_even_over_budget() -> None:
    call = m("assistant", 2, 40, tool_calls=({"id": "c1"}, {"id": "c2"}))
    stored = (m("user", 1, 10), call)
    results = (
        Message(role="tool", content="r1", tool_call_id="c1", tokens=5),
        Message(role="tool", content="r2", tool_call_id="c2", tokens=5),
    )
    context = assemble(turn(stored, new=results), limits(budget=20))
    assert context.messages == (SYSTEM, call, *results)
    assert context.receipt.tiers == {"prompt": 7, "window": 40, "new": 10}
    assert context.receipt.window_indexes == (2,)


def test_new_tool_results_call_counts_against_the_window_limits() -> None:
    call = m("assistant", 4, 10, tool_calls=({"id": "c1"},))
    stored = (*prior(3), call)
    results = (Message(role="tool", content="r", tool_call_id="c1", tokens=5),)
    context = assemble(turn(stored, new=results), limits(max_messages=2))
    assert indexes(context.messages[1:-1]) == [3, 4]
    context = assemble(turn(stored, new=results), limits(max_tokens=20))
    assert indexes(context.messages[1:-1]) == [3, 4]


def test_new_user_message_does_not_pin_a_pending_call() -> None:
    call = m("assistant", 2, 40, tool_calls=({"id": "c1"},))
    context = assemble(turn((m("user", 1, 10), call)), limits(budget=30 + 39))
    assert context.messages == (SYSTEM, NEW)


def test_unindexed_window_messages_are_not_in_receipt_indexes() -> None:
    imported = (
        Message(role="user", content="old", tokens=4),
        Message(role="assistant", content="x", tokens=4),
    )
    context = assemble(turn(prior(2) + imported), limits())
    assert context.receipt.window_indexes == (1, 2)
    assert context.receipt.tiers["window"] == 28


def test_no_prompt() -> None:
    context = assemble(turn(prior(2), prompt=()), limits())
    assert context.messages == (*prior(2), NEW)
    assert context.receipt.tiers == {"prompt": 0, "window": 20, "new": 20}


def test_receipt() -> None:
    context = assemble(turn(prior(8)), limits(max_messages=4, budget=3000))
    receipt = context.receipt
    assert receipt.tiers == {"prompt": 7, "window": 40, "new": 20}
    assert receipt.window_indexes == (5, 6, 7, 8)
    assert receipt.total_tokens == 7 + 40 + 20 + TOKENS_PER_REPLY
    assert receipt.header() == "prompt=7;window=40;new=20;idx=5-8;budget=3000"
    assert receipt.to_json() == {
        "tiers": {"prompt": 7, "window": 40, "new": 20},
        "total_tokens": 70,
        "budget_tokens": 3000,
        "window_indexes": [5, 6, 7, 8],
    }


def test_receipt_header_without_window() -> None:
    receipt = Receipt(
        tiers={"prompt": 0, "window": 0, "new": 12}, window_indexes=(), budget_tokens=500
    )
    assert receipt.header() == "prompt=0;window=0;new=12;budget=500"
    assert receipt.total_tokens == 12 + TOKENS_PER_REPLY
