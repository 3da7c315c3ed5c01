"""Properties of what is forwarded, over random conversations, tiers, budgets and requests.

The pipeline is the service's, without IO: reconcile the request against the stored
session, give every message its token count, assemble. Whatever the preset, the stored
tiers, the budget or the shape of the request (only the new message, the whole history
resent, tool results as the new messages, a history imported into an empty session, a
resent history with a turn the store missed), with or without recalled excerpts and dates:

(a) the client's system/developer prompt comes first, unchanged;
(b) the new messages come last, unchanged (the cache-stable layout's late message is
    among them only after new tool results: nothing comes between a call and its results);
(c) a tool result is never forwarded without the call it answers, and a call is never
    forwarded without its stored results;
(d) the total stays within the budget whenever the parts that are always sent (prompt,
    new messages, the window's keep_last) fit; otherwise only those parts are sent;
(e) the receipt's total is the real total;
(f) at most one memory message, right after the prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.memory.assemble import Context, Recalled, window_units
from gateway.memory.block import MEMORY_HEADER, RECALLED_HEADER, quoted
from gateway.memory.counting import TOKENS_PER_MESSAGE, TOKENS_PER_REPLY
from gateway.memory.layout import build_context
from gateway.memory.model import (
    CONVERSATION_ROLES,
    Fact,
    KeyQA,
    Message,
    Pin,
    RollingSummary,
    SessionState,
    Summary,
    Tiers,
)
from gateway.memory.reconcile import Reconciled, reconcile
from gateway.presets import (
    PRESETS,
    ChunkTier,
    Composition,
    FactsTier,
    PinsTier,
    RecursiveTier,
    RollingTier,
    StableLayout,
    TierName,
    WindowTier,
)
from gateway.text.tokens import TokenCounter

Count = Callable[[str], int]


def words(text: str) -> int:
    return len(text.split())


REAL = TokenCounter().count_text
COUNTERS: dict[str, Count] = {"words": words, "tiktoken": REAL}


def filler(tag: str, n: int) -> str:
    return " ".join([tag] + ["lorem"] * n)


def calls(ids: Sequence[str]) -> tuple[dict[str, Any], ...]:
    return tuple(
        {"id": c, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
        for c in ids
    )


# --- random data ---------------------------------------------------------------------------


@dataclass
class Scenario:
    state: SessionState
    request: tuple[Message, ...]
    prompt: tuple[Message, ...]
    new: tuple[Message, ...]
    stored: tuple[Message, ...]  # the whole stored conversation (not only the loaded tail)
    shape: str
    now: float = 0.0  # the request's time (0: no dates)
    recalled: tuple[Recalled, ...] = ()  # what recall found for the new message


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    size = st.integers(0, 40)
    counter = iter(range(1, 10_000))

    def text() -> str:
        return filler(f"m{next(counter)}", draw(size))

    # The stored conversation: users, answers, and tool chains (a call with or without
    # text, 1-3 results, then usually a final answer).
    conversation: list[Message] = []
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["turn", "turn", "tools", "user", "assistant"]))
        if kind in ("turn", "user"):
            conversation.append(Message(role="user", content=text()))
        if kind == "tools":
            conversation.append(Message(role="user", content=text()))
            ids = [f"call{next(counter)}" for _ in range(draw(st.integers(1, 3)))]
            said = draw(st.sampled_from([None, "", "let me check"]))
            conversation.append(Message(role="assistant", content=said, tool_calls=calls(ids)))
            for call_id in ids:
                conversation.append(Message(role="tool", content=text(), tool_call_id=call_id))
        if kind in ("turn", "assistant", "tools"):
            conversation.append(Message(role="assistant", content=text()))

    shape = draw(st.sampled_from(["new only", "resend", "tool results", "import", "missed turn"]))
    if shape == "tool results":
        ids = [f"call{next(counter)}" for _ in range(draw(st.integers(1, 3)))]
        conversation.append(Message(role="user", content=text()))
        conversation.append(Message(role="assistant", content=None, tool_calls=calls(ids)))
        new: tuple[Message, ...] = tuple(
            Message(role="tool", content=text(), tool_call_id=call_id) for call_id in ids
        )
        shape = draw(st.sampled_from(["tool results (new only)", "tool results (resend)"]))
    else:
        conversation.append(Message(role="assistant", content=text()))
        new = (Message(role="user", content=text()),)
    # A turn the client has and the store missed (Redis was away): imported before the new.
    missed: tuple[Message, ...] = ()
    if shape == "missed turn":
        missed = (Message(role="user", content=text()), Message(role="assistant", content=text()))

    prompt = tuple(
        Message(role=draw(st.sampled_from(["system", "developer"])), content=text())
        for _ in range(draw(st.integers(0, 2)))
    )

    if shape == "import":
        stored: tuple[Message, ...] = ()
        state = SessionState()
    else:
        stored = tuple(
            replace(m, index=i, tokens=draw(st.integers(1, 60)))
            for i, m in enumerate(conversation, start=1)
        )
        loaded = draw(st.integers(min(1, len(stored)), len(stored)))
        state = SessionState(
            message_count=len(stored), tail=stored[len(stored) - loaded :], exists=bool(stored)
        )
    resend = shape in ("resend", "import", "tool results (resend)", "missed turn")
    history = (*conversation, *missed) if resend else ()
    request = (*prompt, *history, *new)
    now = draw(st.sampled_from([0.0, 1_700_000_000.0]))
    said = [m for m in stored if m.role in ("user", "assistant") and m.text]
    hits = draw(st.lists(st.sampled_from(said), max_size=6, unique_by=id)) if said else []
    recalled = tuple(Recalled(m) for m in hits)
    return Scenario(state, request, prompt, new, stored, shape, now, recalled)


@st.composite
def stored_tiers(draw: st.DrawFn, count: int) -> tuple[Tiers, tuple[Pin, ...]]:
    size = st.integers(0, 80)
    last = max(count, 1)

    def span() -> tuple[int, int]:
        start = draw(st.integers(1, last))
        return start, draw(st.integers(start, last))

    summaries = []
    for i in range(draw(st.integers(0, 7))):
        start, end = span()
        summaries.append(Summary(start, end, filler(f"summary{i}", draw(size))))
    summaries.sort(key=lambda s: s.start)
    rolling = None
    if draw(st.booleans()):
        start, end = span()
        rolling = RollingSummary(filler("rolling", draw(size)), start, end, version=3, turn=2)
    key_qa = tuple(
        KeyQA(filler(f"q{i}", draw(size)), filler(f"a{i}", draw(size)), ("tag",), turn=i)
        for i in range(draw(st.integers(0, 10)))
    )
    facts = tuple(
        Fact(filler(f"fact{i}", draw(st.integers(0, 15)))) for i in range(draw(st.integers(0, 25)))
    )
    pins = tuple(
        Pin(f"pin{i}", filler(f"pin{i}", draw(size)), draw(st.floats(0, 1)), created=float(i))
        for i in range(draw(st.integers(0, 8)))
    )
    tiers = Tiers(
        version=5, summaries=tuple(summaries), rolling=rolling, key_qa=key_qa, facts=facts
    )
    return tiers, pins


TIER_NAMES: list[TierName] = [
    "window_keep",
    "pins",
    "summaries",
    "rolling",
    "key_qa",
    "facts",
    "window",
]


@st.composite
def compositions(draw: st.DrawFn) -> Composition:
    """Any valid composition: tiers, limits and priorities the presets do not use."""
    maybe = st.one_of(st.none(), st.integers(1, 30))
    window = WindowTier(
        messages=draw(maybe),
        tokens=draw(st.one_of(st.none(), st.integers(1, 600))),
        turns=draw(st.one_of(st.none(), st.integers(1, 5))),
        keep_last=draw(st.integers(0, 4)),
        after_summarized=draw(st.booleans()),
    )
    evolving = draw(st.sampled_from(["none", "recursive", "rolling"]))
    chunks = None
    if draw(st.booleans()):
        chunks = ChunkTier(use=draw(maybe))
    return Composition(
        window=window,
        chunks=chunks,
        recursive=RecursiveTier() if evolving == "recursive" else None,
        rolling=RollingTier(keep_pairs=draw(st.integers(1, 8))) if evolving == "rolling" else None,
        facts=FactsTier(use=draw(st.integers(1, 20))) if draw(st.booleans()) else None,
        pins=PinsTier(use=draw(st.integers(1, 6))) if draw(st.booleans()) else None,
        priority=draw(
            st.permutations(TIER_NAMES).flatmap(
                lambda names: st.integers(0, len(names)).map(lambda k: list(names[:k]))
            )
        ),
    )


# --- the pipeline and the checks -----------------------------------------------------------


def counted(messages: tuple[Message, ...], count: Count) -> tuple[Message, ...]:
    """As the service does: a message without a count gets one (stored ones keep theirs)."""
    out = []
    for m in messages:
        if not m.tokens:
            tool = sum(
                count(str(c.get("function", {}).get("name", ""))) for c in m.tool_calls or ()
            )
            m = replace(m, tokens=TOKENS_PER_MESSAGE + count(m.text) + tool)
        out.append(m)
    return tuple(out)


def pipeline(
    scenario: Scenario,
    tiers: Tiers,
    pins: Sequence[Pin],
    composition: Composition,
    budget: int,
    role: str,
    count: Count,
) -> tuple[Reconciled, Context]:
    plan = reconcile(scenario.request, scenario.state)
    plan = replace(
        plan,
        prompt=counted(plan.prompt, count),
        prior=counted(plan.prior, count),
        to_record=counted(plan.to_record, count),
        new=counted(plan.new, count),
    )
    context = build_context(
        plan,
        tiers=tiers,
        pins=pins,
        composition=composition,
        budget_tokens=budget,
        memory_role=role,
        count=count,
        recalled=scenario.recalled,
        now=scenario.now,
    )
    return plan, context


def wire(messages: Sequence[Message]) -> list[dict[str, Any]]:
    return [m.to_openai() for m in messages]


def tokens(messages: Sequence[Message]) -> int:
    return sum(m.tokens for m in messages)


def check(
    scenario: Scenario,
    tiers: Tiers,
    pins: Sequence[Pin],
    composition: Composition,
    budget: int,
    role: str,
    count: Count,
) -> None:
    plan, context = pipeline(scenario, tiers, pins, composition, budget, role, count)
    out = context.messages
    receipt = context.receipt
    prompt, new = scenario.prompt, scenario.new

    # (a) the prompt first, unchanged; (b) the new messages last, unchanged (but for the
    # late message, checked below).
    late_at = [
        i
        for i, m in enumerate(out)
        if isinstance(m.content, str) and m.content.startswith(RECALLED_HEADER)
    ]
    assert wire(out[: len(prompt)]) == wire(prompt)
    sent = [m for i, m in enumerate(out) if i not in late_at]
    assert wire(sent[len(sent) - len(new) :]) == wire(new)
    assert len(out) >= len(prompt) + len(new)

    # (f) at most one memory message, right after the prompt.
    memory_at = [
        i
        for i, m in enumerate(out)
        if isinstance(m.content, str) and m.content.startswith(MEMORY_HEADER)
    ]
    assert memory_at in ([], [len(prompt)])
    memory = out[len(prompt)] if memory_at else None
    if memory is not None:
        assert memory.role == role
        assert isinstance(memory.content, str)
        assert memory.tokens == count(memory.content) + TOKENS_PER_MESSAGE
        assert receipt.tiers["memory"] == memory.tokens
    else:
        assert "memory" not in receipt.tiers
    # The cache-stable layout's late message (recalled excerpts, dates): just before the
    # new messages, or after the new tool results that open them; only there.
    results = next((n for n, m in enumerate(new) if m.role != "tool"), len(new))
    assert late_at in ([], [len(out) - (len(new) - results) - 1])
    assert not late_at or composition.stable is not None
    if late_at:
        assert out[late_at[0]].role == role
        assert receipt.tiers["recall"] == out[late_at[0]].tokens
    else:
        assert "recall" not in receipt.tiers
    body = out[len(prompt) + (memory is not None) : len(out) - len(new) - len(late_at)]
    assert all(m.role in CONVERSATION_ROLES for m in body)

    # The window is the newest end of what came before this turn, in order.
    prior = plan.prior
    assert body == prior[len(prior) - len(body) :]

    # (c) tool results only right after their call; calls with all their stored results.
    stored_results = {m.tool_call_id for m in (*scenario.stored, *prior, *new) if m.role == "tool"}
    check_tool_pairs(out, stored_results)

    # (e) the receipt tells the truth.
    assert receipt.total_tokens == tokens(out) + TOKENS_PER_REPLY
    assert receipt.tiers["prompt"] == tokens(plan.prompt)
    assert receipt.tiers["window"] == tokens(body)
    assert receipt.tiers["new"] == tokens(plan.new)
    assert receipt.window_indexes == tuple(m.index for m in body if m.index)
    assert receipt.budget_tokens == budget
    assert all(v > 0 for v in receipt.dropped.values())
    if memory is not None:
        assert isinstance(memory.content, str)
        for pin_id in receipt.pins:
            assert any(p.id == pin_id and quoted(p.content) in memory.content for p in pins)
        for start, end in receipt.summaries:
            assert f"### Messages {start}-{end}\n" in memory.content
    else:
        assert receipt.pins == () and receipt.summaries == ()

    # (d) the budget, and what is always sent.
    units = window_units(plan, tiers, composition)
    keep = kept = 0
    while keep < len(units) and kept < composition.window.keep_last:
        kept += len(units[keep])
        keep += 1
    if new[0].role == "tool" and units and keep == 0:
        keep = 1
    always_window = tuple(m for unit in reversed(units[:keep]) for m in unit)
    assert body[len(body) - len(always_window) :] == always_window, "keep_last not sent"
    always = tokens(plan.prompt) + tokens(plan.new) + tokens(always_window) + TOKENS_PER_REPLY
    if always <= budget:
        assert receipt.total_tokens <= budget
    else:
        assert receipt.total_tokens == always
        assert memory is None and not late_at and body == always_window

    # The window's own limits (the call that new tool results answer comes regardless).
    forced = bool(body) and new[0].role == "tool" and len(units) == 1 and body == units[0]
    if not forced:
        check_window_limits(body, composition, tiers)


def check_tool_pairs(out: Sequence[Message], stored_results: set[str | None]) -> None:
    """Tool results only right after their call; calls with all their stored results."""
    for position, message in enumerate(out):
        if message.role == "tool":
            head = position
            while out[head].role == "tool":
                head -= 1
                assert head >= 0, "tool results without their call"
            caller = out[head]
            assert caller.role == "assistant" and caller.tool_calls, "results without their call"
            assert message.tool_call_id in {c["id"] for c in caller.tool_calls}
        if message.role == "assistant" and message.tool_calls:
            following = set()
            for later in out[position + 1 :]:
                if later.role != "tool":
                    break
                following.add(later.tool_call_id)
            for call in message.tool_calls:
                if call["id"] in stored_results:
                    assert call["id"] in following, "a call forwarded without its results"


def check_window_limits(body: Sequence[Message], composition: Composition, tiers: Tiers) -> None:
    window = composition.window
    most = composition.stable.window_messages if composition.stable else window.messages
    if most is not None:
        assert len(body) <= most
    if window.tokens is not None:
        assert tokens(body) <= window.tokens
    if window.turns is not None:
        assert sum(1 for m in body if m.role == "user") <= window.turns
    if window.after_summarized and tiers.summaries:
        covered = max(s.end for s in tiers.summaries)
        assert all(not m.index or m.index > covered for m in body)


# --- the properties ------------------------------------------------------------------------


@st.composite
def cases(draw: st.DrawFn) -> tuple[Scenario, Tiers, tuple[Pin, ...], int, str, str]:
    scenario = draw(scenarios())
    tiers, pins = draw(stored_tiers(scenario.state.message_count))
    budget = draw(st.one_of(st.integers(1, 400), st.integers(400, 3000)))
    role = draw(st.sampled_from(["system", "developer"]))
    counter = draw(st.sampled_from(sorted(COUNTERS)))
    return scenario, tiers, pins, budget, role, counter


# Every preset, and the default one in the cache-stable layout (``memory.stable_layout``).
LAYOUTS = {
    **PRESETS,
    "hybrid-recall, stable": PRESETS["hybrid-recall"].model_copy(update={"stable": StableLayout()}),
}


@pytest.mark.parametrize("preset", list(LAYOUTS))
@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_invariants_for_every_preset(
    preset: str, case: tuple[Scenario, Tiers, tuple[Pin, ...], int, str, str]
) -> None:
    scenario, tiers, pins, budget, role, counter = case
    check(scenario, tiers, pins, LAYOUTS[preset], budget, role, COUNTERS[counter])


@settings(max_examples=150, deadline=None)
@given(case=cases(), composition=compositions())
def test_invariants_for_any_composition(
    case: tuple[Scenario, Tiers, tuple[Pin, ...], int, str, str], composition: Composition
) -> None:
    scenario, tiers, pins, budget, role, counter = case
    check(scenario, tiers, pins, composition, budget, role, COUNTERS[counter])


@pytest.mark.parametrize("preset", list(LAYOUTS))
@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_an_ample_budget_drops_nothing(
    preset: str, case: tuple[Scenario, Tiers, tuple[Pin, ...], int, str, str]
) -> None:
    # Only the tiers' own limits (window size, use, keep_pairs) leave anything out.
    scenario, tiers, pins, _, role, counter = case
    composition = LAYOUTS[preset]
    plan, context = pipeline(scenario, tiers, pins, composition, 10**9, role, COUNTERS[counter])
    assert context.receipt.dropped == {}
    if composition.stable is not None:
        # The window from its anchor (at most its own count), the memory of what came
        # before the anchor's memory step: checked in test_stable_layout.
        return
    units = window_units(plan, tiers, composition)
    body = tuple(m for unit in reversed(units) for m in unit)
    assert context.messages[len(context.messages) - len(plan.new) - len(body) :] == (
        *body,
        *plan.new,
    )
    chunks = composition.chunks
    if chunks is not None:
        use = len(tiers.summaries) if chunks.use is None else min(chunks.use, len(tiers.summaries))
        assert len(context.receipt.summaries) == use
    if composition.pins is not None:
        assert len(context.receipt.pins) == min(composition.pins.use, len(pins))
