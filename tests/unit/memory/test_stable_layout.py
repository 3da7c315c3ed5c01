"""The cache-stable layout: what changes least comes first, and the window is appended to.

Counts are one token per word (``count``), as in test_assemble.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.memory.assemble import Context, Recalled
from gateway.memory.block import MEMORY_HEADER, RECALLED_HEADER
from gateway.memory.layout import build_context
from gateway.memory.model import Fact, Message, RollingSummary, Summary, Tiers
from gateway.memory.prompt_cache import common_prefix
from gateway.memory.reconcile import Reconciled
from gateway.memory.stable_layout import tiers_before
from gateway.memory.tiers.window import anchored, step_start
from gateway.presets import PRESETS, StableLayout

DAY = 86_400.0
STABLE = PRESETS["hybrid-recall"].model_copy(update={"stable": StableLayout(step=4)})


def count(text: str) -> int:
    return len(text.split())


def said(n: int, tokens: int = 10) -> Message:
    role = "user" if n % 2 else "assistant"
    return Message(role=role, content=f"{role} {n}", index=n, tokens=tokens, ts=1_700_000_000 + n)


def turn(n: int, tokens: int = 10) -> Reconciled:
    """The turn after ``n`` stored messages: a system prompt and one new user message."""
    prompt = (Message(role="system", content="be brief", tokens=5),)
    new = (Message(role="user", content=f"question {n + 1}", tokens=5),)
    prior = tuple(said(i, tokens) for i in range(max(1, n - 63), n + 1))
    return Reconciled(prompt=prompt, prior=prior, new=new, to_record=new)


def build(
    n: int, tiers: Tiers | None = None, recalled: Sequence[Recalled] = (), budget: int = 400
) -> Context:
    return build_context(
        turn(n),
        tiers=tiers or Tiers(),
        pins=(),
        composition=STABLE,
        budget_tokens=budget,
        memory_role="system",
        count=count,
        recalled=recalled,
        now=1_700_000_000 + DAY,
    )


def flat(context: Context) -> list[str]:
    """The forwarded messages as a list of words: a stand-in for the provider's tokens."""
    return [word for m in context.messages for word in (m.role, *m.text.split())]


def summaries(*spans: tuple[int, int]) -> Tiers:
    return Tiers(summaries=tuple(Summary(a, b, f"summary of {a} to {b}") for a, b in spans))


def test_the_order_is_prompt_memory_window_recalled_new() -> None:
    tiers = summaries((1, 10), (11, 20))
    hit = Recalled(said(3))
    context = build(60, tiers, [hit], budget=1000)
    roles = [m.role for m in context.messages]
    assert context.messages[0].text == "be brief"
    assert context.messages[1].text.startswith(MEMORY_HEADER)
    late = context.messages[-2]
    assert late.text.startswith(RECALLED_HEADER) and "user 3" in late.text
    assert "Today is" in late.text  # the dates are late too: they change every day
    assert context.messages[-1].text == "question 61"
    window = context.messages[2:-2]
    assert all(m.index for m in window) and roles[2:-2] == [m.role for m in window]
    assert context.receipt.tiers["recall"] == late.tokens
    assert context.receipt.recalled == ("3",)
    # The memory message's sections only (the inspector splits the memory tier by them):
    # the late message is a tier of its own.
    assert set(context.receipt.memory_sections) == {"summaries"}
    assert context.receipt.total_tokens <= 1000


def test_the_window_is_appended_to_and_moves_by_whole_steps() -> None:
    tiers = summaries(*((a, a + 9) for a in range(1, 200, 10)))
    previous: Context | None = None
    moves = 0
    for n in range(40, 120, 2):  # a turn adds a question and its answer
        context = build(n, tiers)
        if previous is not None:
            first, last = context.receipt.window_indexes[0], previous.receipt.window_indexes[0]
            if first == last:
                # The whole of the last context but its late message and new message is
                # the start of this one.
                shared = common_prefix(flat(context), flat(previous))
                kept = previous.messages[:-2]
                assert shared >= sum(1 + len(m.text.split()) for m in kept)
            else:
                moves += 1
                assert (first - 1) % 4 == 0 and first > last  # a step start, forward
        previous = context
    assert 0 < moves <= 40 // 2  # the anchor stays for at least two turns


def test_the_memory_is_of_what_came_before_the_anchor_step() -> None:
    tiers = summaries((1, 10), (11, 20), (21, 30), (31, 40), (41, 50))
    context = build(52, tiers, budget=600)
    anchor = context.receipt.window_indexes[0]
    memory_start = step_start(anchor, STABLE.stable.memory_step if STABLE.stable else 0)
    assert context.receipt.summaries  # some of them shown
    assert all(end < memory_start for _, end in context.receipt.summaries)


def test_facts_before_the_anchor_and_supersession_among_them_only() -> None:
    tiers = Tiers(
        facts=(
            Fact("lives in Oslo", 1, 2, key="home", superseded=True),  # by Rome, stored
            Fact("likes tea", 3, 4, key="drink", superseded=True),
            Fact("likes coffee", 5, 6, key="drink"),
            Fact("lives in Rome", 30, 31, key="home"),
        )
    )
    before = tiers_before(tiers, 10)
    assert [(f.text, f.superseded) for f in before.facts] == [
        ("lives in Oslo", False),  # Rome, after the anchor, does not supersede it here
        ("likes tea", True),
        ("likes coffee", False),
    ]
    assert tiers_before(tiers, 10) is before  # kept with the tiers value


def test_anchored_keeps_the_step_start_of_the_oldest_unit_that_fits() -> None:
    units = [(said(i),) for i in range(30, 0, -1)]  # newest first, 10 tokens each
    window = anchored(units, target=100, most=500, step=8, keep=2)
    # The newest 100 tokens start at 21; its step starts at 17.
    assert [u[0].index for u in window][-1] == 17
    # From 17 is past ``most``: from the start of the half step, 21.
    window = anchored(units, target=100, most=120, step=8, keep=2)
    assert [u[0].index for u in window][-1] == 21
    # The newest ``keep`` units whatever their size.
    assert anchored(units, target=0, most=0, step=8, keep=2) == units[:2]


def test_anchored_without_indexes_is_the_newest_that_fit() -> None:
    units = [(Message(role="user", content="x", tokens=10),) for _ in range(5)]
    assert len(anchored(units, target=30, most=30, step=4, keep=1)) == 3


def test_over_budget_only_what_is_always_sent() -> None:
    context = build(60, summaries((1, 10)), [Recalled(said(3))], budget=20)
    assert not any(m.text.startswith((MEMORY_HEADER, RECALLED_HEADER)) for m in context.messages)
    assert context.messages[-1].text == "question 61"


CALL = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}


def test_new_tool_results_follow_their_call_and_the_late_message_follows_them() -> None:
    """Nothing may come between a call and its results (OpenAI refuses it): the late
    message goes after the new results, before a new message that is not one."""
    asked = Message(role="assistant", content=None, index=61, tokens=10, tool_calls=(CALL,))
    result = Message(role="tool", content="sunny", tool_call_id="c1", tokens=5)
    question = Message(role="user", content="and tomorrow?", tokens=5)
    for new in ((result,), (result, question)):
        base = turn(60)
        plan = Reconciled(prompt=base.prompt, prior=(*base.prior, asked), new=new, to_record=new)
        context = build_context(
            plan, tiers=Tiers(), pins=(), composition=STABLE, budget_tokens=400,
            memory_role="system", count=count, recalled=[Recalled(said(3))],
            now=1_700_000_000 + DAY,
        )  # fmt: skip
        texts = [m.text for m in context.messages]
        at = texts.index("sunny")
        assert context.messages[at - 1] is asked
        assert context.messages[at + 1].text.startswith(RECALLED_HEADER)
        assert context.messages[at + 2 :] == new[1:]


def test_anchored_keeps_the_newest_messages_not_stored_yet() -> None:
    """Messages a client resent that the store missed (imported this turn) or an edit's
    branch come without an index, after every stored one: they are the window's newest."""
    fresh = [(Message(role="user", content=f"imported {n}", tokens=10),) for n in range(3)]
    units = fresh + [(said(i),) for i in range(30, 0, -1)]
    window = anchored(units, target=100, most=500, step=8, keep=2)
    assert window[:3] == fresh
    assert [u[0].index for u in window[3:]] == list(range(30, 16, -1))  # from a step start


def test_a_window_cut_by_its_count_still_moves_by_whole_steps() -> None:
    """Short messages: the layout's count (here the 20 loaded), not the tokens, bounds
    the window. Its anchor is still a step start, and stays for turns on end."""
    starts = []
    for newest in range(40, 72, 2):
        units = [(said(i, tokens=3),) for i in range(newest, newest - 20, -1)]
        window = anchored(units, target=1000, most=1000, step=8, keep=2)
        starts.append(window[-1][0].index)
    assert all((start - 1) % 8 == 0 for start in starts)
    assert len(set(starts)) <= len(starts) // 4 + 1  # moved once every 4 turns at most


def test_the_one_evolving_summary_is_shown_as_it_stands() -> None:
    """It has no version as of the anchor, and it is the seed presets' only memory of what
    came before the window: left out while it reached past the anchor, it never showed."""
    for preset in ("recursive-summary", "rolling-summary"):
        composition = PRESETS[preset].model_copy(update={"stable": StableLayout()})
        for n in (60, 100, 140):
            story = RollingSummary("the story so far " * 20, 1, n - 10, version=3, turn=2)
            context = build_context(
                turn(n), tiers=Tiers(rolling=story), pins=(), composition=composition,
                budget_tokens=3000, memory_role="system", count=count,
            )  # fmt: skip
            assert context.messages[1].text.startswith(MEMORY_HEADER), (preset, n)
            assert "the story so far" in context.messages[1].text
