"""What is forwarded: prompt, memory message, window, new messages, within the budget.

Token counts in these tables come from ``count`` (one token per word), so every number
can be checked by hand: a memory item costs its words + 1 (its line), a section its
heading's words + 2, the memory message its header's words + 3 (message framing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from gateway.memory.assemble import Context, Receipt, assemble, window_units
from gateway.memory.block import MEMORY_HEADER
from gateway.memory.counting import TOKENS_PER_MESSAGE, TOKENS_PER_REPLY
from gateway.memory.model import Fact, KeyQA, Message, Pin, RollingSummary, Summary, Tiers
from gateway.memory.reconcile import Reconciled
from gateway.presets import (
    PRESETS,
    ChunkTier,
    Composition,
    FactsTier,
    PinsTier,
    RollingTier,
    WindowTier,
)
from gateway.text.tokens import TokenCounter
from tests.support.encoding import encoded_texts


def count(text: str) -> int:
    return len(text.split())


H = count(MEMORY_HEADER)  # 16 words


def u(n: int, tokens: int = 10) -> Message:
    return Message(role="user", content=f"user {n}", index=n, tokens=tokens)


def a(n: int, tokens: int = 10, calls: tuple[str, ...] = (), content: str | None = None) -> Message:
    tool_calls = tuple(
        {"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}} for c in calls
    )
    text = content if content is not None or calls else f"assistant {n}"
    return Message(
        role="assistant", content=text, index=n, tokens=tokens, tool_calls=tool_calls or None
    )


def t(n: int, call: str, tokens: int = 10) -> Message:
    return Message(role="tool", content=f"result {n}", index=n, tokens=tokens, tool_call_id=call)


def conv(n: int, tokens: int = 10) -> tuple[Message, ...]:
    """``n`` stored messages, user/assistant alternating from a user message, indexes 1..n."""
    return tuple(u(i, tokens) if i % 2 else a(i, tokens) for i in range(1, n + 1))


SYSTEM = Message(role="system", content="be nice", tokens=7)
DEVELOPER = Message(role="developer", content="be brief", tokens=5)
NEW = Message(role="user", content="question", tokens=20)
FIXED = 7 + 20 + TOKENS_PER_REPLY  # SYSTEM + NEW + the reply's framing


def turn(
    prior: Sequence[Message],
    new: Sequence[Message] = (NEW,),
    prompt: Sequence[Message] = (SYSTEM,),
) -> Reconciled:
    return Reconciled(
        prompt=tuple(prompt), prior=tuple(prior), to_record=tuple(new), new=tuple(new)
    )


def run(
    plan: Reconciled,
    composition: Composition,
    *,
    tiers: Tiers | None = None,
    pins: Sequence[Pin] = (),
    budget: int = 100_000,
    role: str = "system",
    counter: Any = count,
) -> Context:
    return assemble(
        plan,
        tiers=tiers or Tiers(),
        pins=pins,
        composition=composition,
        budget_tokens=budget,
        memory_role=role,
        count=counter,
    )


def memory_text(context: Context, prompt: int = 1) -> str | None:
    """The memory message's content, asserting it is the only one and where it belongs."""
    found = [
        i
        for i, m in enumerate(context.messages)
        if isinstance(m.content, str) and m.content.startswith(MEMORY_HEADER)
    ]
    assert len(found) <= 1
    if not found:
        return None
    assert found == [prompt]
    content = context.messages[prompt].content
    assert isinstance(content, str)
    return content


def window(context: Context, prompt: int = 1, new: int = 1) -> list[int]:
    """Indexes of the window messages forwarded (between the memory message and the new)."""
    start = prompt + (memory_text(context, prompt) is not None)
    return [m.index for m in context.messages[start : len(context.messages) - new]]


def total(context: Context) -> int:
    return sum(m.tokens for m in context.messages) + TOKENS_PER_REPLY


def pin(pid: str, importance: float, created: float = 0.0, words: int = 1) -> Pin:
    content = " ".join([pid] + ["p"] * (words - 1))
    return Pin(pid, content, importance, created=created)


def summary(start: int, end: int, words: int = 1) -> Summary:
    return Summary(start, end, " ".join([f"s{start}"] + ["s"] * (words - 1)))


HYBRID = PRESETS["hybrid"]
ROLLING_WINDOW = PRESETS["rolling-window"]
RECURSIVE = PRESETS["recursive-summary"]
ROLLING = PRESETS["rolling-summary"]
PROGRESSIVE = PRESETS["progressive"]
WINDOW_ONLY = Composition(window=WindowTier(messages=None, keep_last=0), priority=["window"])


# --- placement -----------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["system", "developer"])
@pytest.mark.parametrize(
    "prompt",
    [
        pytest.param((), id="no prompt"),
        pytest.param((SYSTEM,), id="system"),
        pytest.param((SYSTEM, DEVELOPER), id="system+developer"),
    ],
)
def test_memory_message_follows_the_prompt(role: str, prompt: tuple[Message, ...]) -> None:
    context = run(
        turn(conv(10), prompt=prompt),
        HYBRID,
        tiers=Tiers(summaries=(summary(1, 2),)),
        pins=[pin("p1", 0.9)],
        role=role,
    )
    messages = context.messages
    assert messages[: len(prompt)] == prompt
    memory = messages[len(prompt)]
    assert memory.role == role
    assert isinstance(memory.content, str) and memory.content.startswith(MEMORY_HEADER)
    assert memory.tokens == count(memory.content) + TOKENS_PER_MESSAGE
    assert window(context, len(prompt)) == list(range(3, 11))  # hybrid: the last 8
    assert messages[-1] == NEW
    assert context.openai_messages()[len(prompt)] == {"role": role, "content": memory.content}


def test_no_memory_message_when_there_is_nothing_to_recall() -> None:
    context = run(turn(conv(4)), HYBRID)
    assert context.messages == (SYSTEM, *conv(4), NEW)
    assert "memory" not in context.receipt.tiers
    assert context.openai_messages()[-1] == {"role": "user", "content": "question"}


def test_tiers_outside_the_composition_are_not_sent() -> None:
    tiers = Tiers(
        rolling=RollingSummary("evolving", 1, 4),
        key_qa=(KeyQA("q", "a"),),
        facts=(Fact("fact"),),
    )
    assert memory_text(run(turn(conv(4)), HYBRID, tiers=tiers)) is None  # hybrid: pins, chunks
    only_window = Composition(window=WindowTier(), priority=["window_keep", "window"])
    context = run(
        turn(conv(4)), only_window, tiers=Tiers(summaries=(summary(1, 2),)), pins=[pin("p", 1.0)]
    )
    assert memory_text(context) is None


# --- sections ------------------------------------------------------------------------------

EVERYTHING = Composition(
    window=WindowTier(messages=2, keep_last=0),
    chunks=ChunkTier(use=None),
    rolling=RollingTier(keep_pairs=2),
    facts=FactsTier(use=2),
    pins=PinsTier(use=2),
    # The reverse of the rendering order: sections are still rendered in their own order.
    priority=["key_qa", "summaries", "rolling", "facts", "pins", "window"],
)
EVERYTHING_TIERS = Tiers(
    summaries=(Summary(1, 4, "first chunk"), Summary(5, 8, "second chunk")),
    rolling=RollingSummary("so far so good", 1, 8),
    key_qa=(KeyQA("q1", "a1"), KeyQA("q2", "a2", ("x", "y")), KeyQA("q3", "a3")),
    facts=(Fact("f1"), Fact("f2"), Fact("f3")),
)
EVERYTHING_PINS = (pin("low", 0.1), pin("high", 0.9), pin("mid", 0.5))


def test_sections_render_in_a_fixed_order_whatever_the_priority() -> None:
    context = run(turn(conv(10)), EVERYTHING, tiers=EVERYTHING_TIERS, pins=EVERYTHING_PINS)
    assert memory_text(context) == "\n".join(
        [
            MEMORY_HEADER,
            "",
            "## Pinned",
            '- pinned: "high"',
            '- pinned: "mid"',
            "",
            "## Key facts",
            '- from the user\'s messages: "f3"',
            '- from the user\'s messages: "f2"',
            "",
            "## Summary of the conversation so far",
            "(messages 1-8, summarized)",
            "> so far so good",
            "",
            "## Summaries of earlier messages (newest first)",
            "### Messages 5-8",
            "> second chunk",
            "### Messages 1-4",
            "> first chunk",
            "",
            "## Key questions and answers",
            '- Q (the user): "q2"',
            '  A (the assistant): "a2" [x, y]',
            '- Q (the user): "q3"',
            '  A (the assistant): "a3"',
        ]
    )
    assert context.receipt.summaries == ((5, 8), (1, 4))
    assert context.receipt.pins == ("high", "mid")
    assert window(context) == [9, 10]


def test_summaries_newest_first_capped_at_use() -> None:
    stored = (summary(2, 22), summary(23, 43), summary(44, 64), summary(65, 85))
    context = run(turn(conv(85)), ROLLING_WINDOW, tiers=Tiers(summaries=stored))
    text = memory_text(context)
    assert text is not None
    positions = [text.find(f"### Messages {r}") for r in ("65-85", "44-64", "23-43")]
    assert -1 not in positions and positions == sorted(positions)
    assert "Messages 2-22" not in text
    assert context.receipt.summaries == ((65, 85), (44, 64), (23, 43))
    assert window(context) == list(range(65, 86))  # the last 21 messages


def test_progressive_sends_every_stored_summary() -> None:
    stored = tuple(summary(16 * i + 1, 16 * i + 16) for i in range(5))
    context = run(turn(conv(84)), PROGRESSIVE, tiers=Tiers(summaries=stored))
    assert context.receipt.summaries == tuple((s.start, s.end) for s in reversed(stored))


def test_pins_top_n_by_importance_newest_first_among_equals() -> None:
    pins = [
        pin("a", 0.5),
        pin("b", 0.9, created=1),
        pin("c", 0.7),
        pin("d", 0.95),
        pin("e", 0.6),
        pin("f", 0.8),
        pin("g", 0.9, created=2),
    ]
    context = run(turn(conv(4)), HYBRID, pins=pins)  # hybrid sends the top 5
    assert context.receipt.pins == ("d", "g", "b", "f", "c")
    text = memory_text(context)
    assert text is not None
    pinned = [f'- pinned: "{p}"' for p in "dgbfc"]
    assert text.split("## Pinned\n")[1].splitlines() == pinned


def test_facts_newest_first_capped_at_use() -> None:
    facts = tuple(Fact(f"fact{i}", i, i) for i in range(1, 21))
    text = memory_text(run(turn(conv(4)), PROGRESSIVE, tiers=Tiers(facts=facts)))
    assert text is not None
    lines = text.split("## Key facts\n")[1].splitlines()
    expected = [f'- from the user\'s messages: "fact{i}"' for i in range(20, 5, -1)]
    assert lines == expected  # use=15


def test_key_qa_capped_at_keep_pairs_oldest_first() -> None:
    pairs = tuple(KeyQA(f"q{i}", f"a{i}", (f"tag{i}",), turn=i) for i in range(1, 10))
    text = memory_text(run(turn(conv(6)), ROLLING, tiers=Tiers(key_qa=pairs)))
    assert text is not None
    questions = [line for line in text.splitlines() if line.startswith("- Q (the user): ")]
    assert questions == [f'- Q (the user): "q{i}"' for i in range(4, 10)]  # keep_pairs=6
    assert '  A (the assistant): "a9" [tag9]' in text


@pytest.mark.parametrize("composition", [RECURSIVE, ROLLING], ids=["recursive", "rolling"])
def test_the_evolving_summary_with_its_range(composition: Composition) -> None:
    tiers = Tiers(rolling=RollingSummary("the story", 1, 10, version=3))
    text = memory_text(run(turn(conv(20)), composition, tiers=tiers))
    assert text is not None
    assert "## Summary of the conversation so far\n(messages 1-10, summarized)\n> the story" in text


# --- the window ----------------------------------------------------------------------------


def window_of(composition: Composition, prior: Sequence[Message], **kwargs: Any) -> list[int]:
    tiers = kwargs.pop("tiers", Tiers())
    units = window_units(turn(prior, **kwargs), tiers, composition)
    return [m.index for unit in reversed(units) for m in unit]


CHAIN = (u(1), a(2), u(3), a(4, calls=("c1", "c2")), t(5, "c1"), t(6, "c2"), a(7), u(8), a(9))


@pytest.mark.parametrize(
    ("window_tier", "prior", "expected"),
    [
        pytest.param(WindowTier(messages=8), conv(20), list(range(13, 21)), id="8 messages"),
        pytest.param(WindowTier(messages=21), conv(30), list(range(10, 31)), id="21 messages"),
        pytest.param(WindowTier(messages=50), conv(5), [1, 2, 3, 4, 5], id="fewer than limit"),
        pytest.param(WindowTier(messages=None, tokens=35), conv(8), [6, 7, 8], id="35 tokens"),
        pytest.param(WindowTier(messages=None, tokens=40), conv(8), [5, 6, 7, 8], id="40 tokens"),
        pytest.param(WindowTier(messages=None, turns=3), conv(12), list(range(7, 13)),
                     id="3 turns"),
        pytest.param(WindowTier(messages=None, turns=3), conv(11), list(range(7, 12)),
                     id="3 turns, answer not stored yet"),
        pytest.param(WindowTier(messages=None, turns=1), conv(12), [11, 12], id="1 turn"),
        pytest.param(WindowTier(messages=None, turns=2), CHAIN, [3, 4, 5, 6, 7, 8, 9],
                     id="turns take a tool chain whole"),
        pytest.param(WindowTier(messages=5, tokens=1000, turns=10), conv(12), [8, 9, 10, 11, 12],
                     id="messages bind first"),
        pytest.param(WindowTier(messages=5, tokens=25, turns=10), conv(12), [11, 12],
                     id="tokens bind first"),
        pytest.param(WindowTier(messages=5, tokens=1000, turns=1), conv(12), [11, 12],
                     id="turns bind first"),
        pytest.param(WindowTier(messages=4), CHAIN, [7, 8, 9], id="no half tool unit"),
        pytest.param(WindowTier(messages=6), CHAIN, [4, 5, 6, 7, 8, 9], id="whole tool unit"),
        pytest.param(WindowTier(messages=None, tokens=59), CHAIN, [7, 8, 9],
                     id="tool unit over tokens"),
        pytest.param(WindowTier(messages=10), CHAIN[4:], [7, 8, 9],
                     id="never opens with orphan results"),
    ],
)  # fmt: skip
def test_window_limits(
    window_tier: WindowTier, prior: tuple[Message, ...], expected: list[int]
) -> None:
    composition = Composition(window=window_tier, priority=["window_keep", "window"])
    assert window_of(composition, prior) == expected
    assert window(run(turn(prior), composition)) == expected


def test_window_after_summarized_takes_only_what_no_summary_covers() -> None:
    # Seed 003: the buffer of full messages is what the last summary left.
    prior = conv(20)
    assert window_of(PROGRESSIVE, prior) == list(range(1, 21))
    tiers = Tiers(summaries=(summary(1, 16),))
    assert window_of(PROGRESSIVE, prior, tiers=tiers) == [17, 18, 19, 20]
    # The newest summary end counts, whatever the order they are stored in.
    tiers = Tiers(summaries=(summary(9, 16), summary(1, 8)))
    assert window_of(PROGRESSIVE, prior, tiers=tiers) == [17, 18, 19, 20]
    # Imported messages (no index yet) are never covered.
    imported = Message(role="user", content="imported", tokens=5)
    units = window_units(turn((*prior, imported)), tiers, PROGRESSIVE)
    assert [m.content for unit in reversed(units) for m in unit][-1] == "imported"
    # Without after_summarized, summaries do not shorten the window.
    assert window_of(HYBRID, prior, tiers=tiers) == list(range(13, 21))


def test_window_after_summarized_is_token_limited() -> None:
    prior = conv(40, tokens=150)
    # 4000 tokens: 26 messages of 150.
    assert window_of(PROGRESSIVE, prior) == list(range(15, 41))


def test_window_does_not_split_tool_units_under_the_budget() -> None:
    stored = (u(1), a(2, calls=("c1",)), t(3, "c1"), a(4))
    # Room for 2 messages: the unit (2, 3) does not fit behind message 4.
    assert window(run(turn(stored), WINDOW_ONLY, budget=FIXED + 25)) == [4]
    assert window(run(turn(stored), WINDOW_ONLY, budget=FIXED + 30)) == [2, 3, 4]


def test_window_stops_at_the_first_unit_that_does_not_fit() -> None:
    # A big old message is not skipped to reach smaller, older ones: the window is a suffix.
    stored = (u(1, 1), a(2, 1), u(3, 500), a(4, 1))
    assert window(run(turn(stored), WINDOW_ONLY, budget=FIXED + 100)) == [4]


# --- always sent ---------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [1, FIXED - 1, FIXED, FIXED + 29])
def test_prompt_new_and_keep_last_are_sent_even_over_budget(budget: int) -> None:
    context = run(
        turn(conv(8)),
        HYBRID,
        tiers=Tiers(summaries=(summary(1, 2),)),
        pins=[pin("p", 1)],
        budget=budget,
    )
    assert context.messages == (SYSTEM, a(6), u(7), a(8), NEW)
    assert context.receipt.tiers == {"prompt": 7, "window": 30, "new": 20}
    assert context.receipt.total_tokens == FIXED + 30 == total(context)
    assert context.receipt.dropped == {"pins": 1, "summaries": 1, "window": 5}


def test_keep_last_is_counted_in_whole_units() -> None:
    stored = (u(1), a(2), u(3), a(4, calls=("c1", "c2")), t(5, "c1"), t(6, "c2"))
    composition = Composition(window=WindowTier(keep_last=2), priority=["window_keep"])
    assert window(run(turn(stored), composition, budget=1)) == [4, 5, 6]
    stored = (u(1), a(2), u(3), a(4, calls=("c1",)), t(5, "c1"))
    assert window(run(turn(stored), composition, budget=1)) == [4, 5]
    stored = (u(1), a(2), u(3), a(4, calls=("c1",)), t(5, "c1"), a(6))
    assert window(run(turn(stored), composition, budget=1)) == [4, 5, 6]


def test_a_huge_new_message_keeps_only_the_always_sent_parts() -> None:
    big = Message(role="user", content="huge", tokens=5000)
    context = run(turn(conv(6), new=(big,)), HYBRID, pins=[pin("p", 1)], budget=3000)
    assert context.messages == (SYSTEM, a(4), u(5), a(6), big)
    assert context.receipt.total_tokens == 7 + 30 + 5000 + TOKENS_PER_REPLY


def test_new_tool_results_keep_their_call_even_over_budget() -> None:
    call = a(2, 40, calls=("c1", "c2"))
    results = (
        Message(role="tool", content="r1", tool_call_id="c1", tokens=5),
        Message(role="tool", content="r2", tool_call_id="c2", tokens=5),
    )
    context = run(turn((u(1), call), new=results), WINDOW_ONLY, budget=20)
    assert context.messages == (SYSTEM, call, *results)
    assert context.receipt.tiers == {"prompt": 7, "window": 40, "new": 10}
    assert context.receipt.window_indexes == (2,)


@pytest.mark.parametrize(
    "window_tier",
    [
        pytest.param(WindowTier(messages=1, keep_last=0), id="count"),
        pytest.param(WindowTier(messages=None, tokens=5, keep_last=0), id="tokens"),
        pytest.param(WindowTier(messages=None, turns=1, keep_last=0), id="turns"),
        pytest.param(
            WindowTier(messages=None, after_summarized=True, keep_last=0),
            id="after a summary that covers the call",
        ),
    ],
)
def test_new_tool_results_keep_their_call_whatever_the_window(window_tier: WindowTier) -> None:
    call = a(4, 40, calls=("c1",))
    result = Message(role="tool", content="r", tool_call_id="c1", tokens=5)
    composition = Composition(window=window_tier, chunks=ChunkTier(), priority=["summaries"])
    tiers = Tiers(summaries=(summary(1, 4),))
    context = run(turn((*conv(3), call), new=(result,)), composition, tiers=tiers, budget=1)
    assert context.messages == (SYSTEM, call, result)


def test_new_user_message_does_not_keep_a_pending_call() -> None:
    # The call was never answered: not forwarded (it would be refused), and it takes no
    # room from the messages before it.
    call = a(2, 40, calls=("c1",))
    context = run(turn((u(1), call)), WINDOW_ONLY, budget=FIXED + 39)
    assert context.messages == (SYSTEM, u(1), NEW)


# --- what gives way: the priority ----------------------------------------------------------

# Each pin: "- pN" + 8 words = 10 words, an item of 10 tokens (with its line break, free
# for this counter); "## Pinned" costs 4.
PINS = [pin("p1", 0.9, words=9), pin("p2", 0.8, words=9)]
# Each summary: "### Messages a-b" (3 words) + "> " and 20 words, an item of 24; its
# heading costs 9. Each pin: '- pinned: "p1 p …"' (2 words + 9), an item of 11.
SUMMARIES = Tiers(summaries=(summary(1, 2, words=20), summary(3, 4, words=20)))
KEEP = 30  # hybrid keeps the last 3 messages of 10 tokens
PINS_COST = (H + TOKENS_PER_MESSAGE) + 4 + 11 + 11
SUMMARY_COST = 9 + 24


def test_hybrid_tight_budget_pins_survive_before_summaries_old_window_goes_first() -> None:
    budget = FIXED + KEEP + PINS_COST + 25  # after the pins: no room for a summary, 2 messages
    context = run(turn(conv(8)), HYBRID, tiers=SUMMARIES, pins=PINS, budget=budget)
    assert context.receipt.pins == ("p1", "p2")
    assert context.receipt.summaries == ()
    assert window(context) == [4, 5, 6, 7, 8]
    assert context.receipt.dropped == {"summaries": 2, "window": 3}
    assert total(context) <= budget


@pytest.mark.parametrize(
    ("room", "pins", "summaries", "window_indexes"),
    [
        pytest.param(0, (), (), [6, 7, 8], id="nothing but keep_last"),
        pytest.param(PINS_COST - 10, ("p1",), (), [6, 7, 8], id="one pin"),
        pytest.param(PINS_COST, ("p1", "p2"), (), [6, 7, 8], id="both pins"),
        pytest.param(PINS_COST + SUMMARY_COST, ("p1", "p2"), ((3, 4),), [6, 7, 8],
                     id="newest summary"),
        pytest.param(PINS_COST + SUMMARY_COST + 24 + 19, ("p1", "p2"), ((3, 4), (1, 2)),
                     [5, 6, 7, 8], id="both summaries and one more message"),
        pytest.param(10_000, ("p1", "p2"), ((3, 4), (1, 2)), [1, 2, 3, 4, 5, 6, 7, 8],
                     id="everything"),
    ],
)  # fmt: skip
def test_hybrid_truncation_order(
    room: int,
    pins: tuple[str, ...],
    summaries: tuple[tuple[int, int], ...],
    window_indexes: list[int],
) -> None:
    budget = FIXED + KEEP + room
    context = run(turn(conv(8)), HYBRID, tiers=SUMMARIES, pins=PINS, budget=budget)
    assert context.receipt.pins == pins
    assert context.receipt.summaries == summaries
    assert window(context) == window_indexes
    assert total(context) <= budget


def test_priority_window_before_summaries_fills_the_window_first() -> None:
    composition = HYBRID.model_copy(update={"priority": ["window_keep", "window", "summaries"]})
    budget = FIXED + 80 + 10  # the whole window and 10 tokens to spare
    context = run(turn(conv(8)), composition, tiers=SUMMARIES, pins=PINS, budget=budget)
    assert window(context) == list(range(1, 9))
    assert memory_text(context) is None  # pins are not in the priority: never sent
    assert context.receipt.dropped == {"summaries": 2}


def test_the_first_item_that_does_not_fit_ends_its_tier() -> None:
    # The newest summary is big: the smaller, older one is not sent in its place.
    tiers = Tiers(summaries=(summary(1, 2, words=1), summary(3, 4, words=500)))
    context = run(turn(conv(8)), HYBRID, tiers=tiers, budget=FIXED + 100)
    assert context.receipt.summaries == ()
    assert context.receipt.dropped["summaries"] == 2


def test_the_exact_count_decides_and_the_last_item_gives_way() -> None:
    # A counter for which a line break costs 10: the per-item estimate (item + 1) is short.
    def newline_heavy(text: str) -> int:
        return len(text.split()) + 10 * text.count("\n")

    pins = [pin("p1", 0.9), pin("p2", 0.8), pin("p3", 0.7)]
    composition = Composition(window=WindowTier(keep_last=0), pins=PinsTier(), priority=["pins"])
    one_pin = newline_heavy(f'{MEMORY_HEADER}\n\n## Pinned\n- pinned: "p1"') + TOKENS_PER_MESSAGE
    budget = FIXED + one_pin + 5  # the estimate admits all three pins; the text fits one
    context = run(turn(conv(2)), composition, pins=pins, budget=budget, counter=newline_heavy)
    assert context.receipt.pins == ("p1",)
    assert context.receipt.dropped == {"pins": 2}
    assert context.receipt.tiers["memory"] == one_pin
    assert total(context) == FIXED + one_pin


# --- the receipt ---------------------------------------------------------------------------


def test_receipt() -> None:
    tiers = Tiers(summaries=(summary(1, 15), summary(16, 30)))
    pins = [pin("p1", 0.9), pin("p2", 0.5)]
    context = run(turn(conv(32)), HYBRID, tiers=tiers, pins=pins, budget=3000)
    text = memory_text(context)
    assert text is not None
    memory = count(text) + TOKENS_PER_MESSAGE
    receipt = context.receipt
    assert receipt.tiers == {"prompt": 7, "memory": memory, "window": 80, "new": 20}
    assert list(receipt.tiers) == ["prompt", "memory", "window", "new"]
    assert receipt.window_indexes == tuple(range(25, 33))
    assert receipt.summaries == ((16, 30), (1, 15))
    assert receipt.pins == ("p1", "p2")
    assert receipt.dropped == {}
    assert receipt.total_tokens == 7 + memory + 80 + 20 + TOKENS_PER_REPLY == total(context)
    assert receipt.header() == (
        f"prompt=7;memory={memory};window=80;new=20;idx=25-32;sum=16-30,1-15;pins=2;budget=3000"
    )
    assert receipt.to_json() == {
        "tiers": {"prompt": 7, "memory": memory, "window": 80, "new": 20},
        "total_tokens": receipt.total_tokens,
        "budget_tokens": 3000,
        "window_indexes": list(range(25, 33)),
        "summaries": [{"start": 16, "end": 30}, {"start": 1, "end": 15}],
        "pins": ["p1", "p2"],
        "recalled": [],
        "memory_sections": receipt.memory_sections,
        "dropped": {},
        "stable_tokens": None,
    }
    assert set(receipt.memory_sections) == {"pins", "summaries"}


def test_receipt_counts_what_was_dropped() -> None:
    pins = [pin(f"p{i}", 0.5 + i / 100, words=30) for i in range(7)]  # 5 candidates
    context = run(turn(conv(8)), HYBRID, pins=pins, budget=FIXED + KEEP + 80)
    receipt = context.receipt
    assert receipt.pins == ("p6",)
    assert receipt.dropped == {"pins": 4, "window": 3}
    assert receipt.to_json()["dropped"] == {"pins": 4, "window": 3}


def test_receipt_header_without_window_or_memory() -> None:
    receipt = Receipt(
        tiers={"prompt": 0, "window": 0, "new": 12}, window_indexes=(), budget_tokens=500
    )
    assert receipt.header() == "prompt=0;window=0;new=12;budget=500"
    assert receipt.total_tokens == 12 + TOKENS_PER_REPLY


def test_unindexed_window_messages_are_not_in_receipt_indexes() -> None:
    imported = (
        Message(role="user", content="old", tokens=4),
        Message(role="assistant", content="x", tokens=4),
    )
    context = run(turn((*conv(2), *imported)), HYBRID)
    assert context.receipt.window_indexes == (1, 2)
    assert context.receipt.tiers["window"] == 28


def test_with_the_real_token_counter() -> None:
    counter = TokenCounter()
    tiers = Tiers(summaries=(Summary(1, 15, "The user plans a trip to Lisbon in May."),))
    pins = [Pin("p", "Seat 14C, vegetarian meal", 0.95)]
    context = run(
        turn(conv(20)), HYBRID, tiers=tiers, pins=pins, budget=3000, counter=counter.count_text
    )
    text = memory_text(context)
    assert text is not None and "Seat 14C" in text and "Lisbon" in text
    assert context.messages[1].tokens == counter.count_text(text) + TOKENS_PER_MESSAGE
    assert context.receipt.total_tokens == total(context) <= 3000


def test_an_evolving_summary_longer_than_the_budget_is_cut_not_dropped() -> None:
    lines = [f"- the user said fact number {i} about topic {i}" for i in range(400)]
    tiers = Tiers(version=1, rolling=RollingSummary("\n".join(lines), 1, 300, version=3))
    counter = TokenCounter()
    plan = Reconciled(prompt=(), prior=(), to_record=(), new=(Message("user", "hi", tokens=5),))
    context = assemble(
        plan, tiers=tiers, pins=(), composition=PRESETS["recursive-summary"],
        budget_tokens=1000, memory_role="system", count=counter.count_text,
    )  # fmt: skip
    memory = context.messages[0].text
    assert "fact number 0 " in memory and "fact number 399" not in memory
    assert context.receipt.total_tokens <= 1000
    assert context.receipt.dropped.get("rolling_cut") == 1


def test_a_memory_block_is_tokenized_once_not_at_every_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its items are counted with the line break that follows each in the block: the
    pieces the block's exact count looks up. The next request with the same tiers
    (parsed again: equal texts, new strings) encodes nothing at all. (The counter has
    made another session's block before: the headers every block has are counted.)"""

    summaries = tuple(
        Summary(i * 10 + 1, i * 10 + 10, f"Part {i}: the user planned stage {i}.") for i in range(3)
    )
    tiers = Tiers(version=2, summaries=summaries, facts=(Fact("The user's code is 4417", 3),))
    pins = [Pin("p", "Seat 14C", 0.95)]
    encoded = encoded_texts(monkeypatch)
    counter = TokenCounter()
    other = Tiers(version=1, summaries=(Summary(1, 10, "Another session's summary."),))
    run(turn(conv(40)), HYBRID, tiers=other, pins=[Pin("q", "Another pin", 0.9)], budget=5000,
        counter=counter.count_text)  # fmt: skip
    encoded.clear()

    def request() -> Context:
        again = Tiers.from_json(tiers.to_json())
        return run(turn(conv(40)), HYBRID, tiers=again, pins=pins, budget=5000,
                   counter=counter.count_text)  # fmt: skip

    first = request()
    text = memory_text(first)
    assert text is not None and all(s.text in text for s in summaries)
    assert first.messages[1].tokens == counter.count_text(text) + TOKENS_PER_MESSAGE
    # Each line of the block is encoded once: the block's count reused the items'.
    assert len(encoded) == len(set(encoded))
    assert len(encoded) <= len(text.splitlines())
    encoded.clear()
    assert request() == first
    assert encoded == []


def test_the_items_of_unchanged_tiers_are_made_once() -> None:
    """A long session's tiers (tens of summaries and facts) are the same object turn after
    turn while their stored bytes are unchanged (store.tiers_cache): their items are made
    and counted once. The recall hits and pins of each turn are always made anew."""
    tiers = Tiers(
        version=3,
        summaries=tuple(summary(i * 10 + 1, i * 10 + 10, words=3) for i in range(3)),
        facts=(Fact("the user's code is 1234", 5),),
    )
    counted: list[str] = []

    def counting(text: str) -> int:
        counted.append(text)
        return count(text)

    pins = [pin("seat", 0.9)]
    first = run(turn(conv(40)), HYBRID, tiers=tiers, pins=pins, counter=counting)
    assert any("s1 s s" in text for text in counted)  # the summaries were counted
    counted.clear()
    second = run(turn(conv(40)), HYBRID, tiers=tiers, pins=pins, counter=counting)
    assert second == first
    made = ("### Messages", "- from the user's messages")
    assert not any(text.startswith(made) for text in counted)
    assert any(text.startswith('- pinned: "seat') for text in counted)  # this turn's pins


@pytest.mark.parametrize(
    ("change", "facts_sent", "tokens_per_word"),
    [
        ("nothing", ["Lyon", "tea"], 1),
        ("tiers", ["Porto"], 1),
        ("composition", ["tea"], 1),
        ("count", ["Lyon", "tea"], 2),
    ],
)
def test_items_are_made_again_for_new_tiers_a_new_composition_or_another_count(
    change: str, facts_sent: list[str], tokens_per_word: int
) -> None:
    """Remembered by the identity of all three: a summarizer job's new tiers (even of the
    same version), another preset and another model's counting each get their own items,
    never the remembered ones."""
    composition = Composition(window=WindowTier(messages=2), facts=FactsTier(), priority=["facts"])
    tiers = Tiers(version=1, facts=(Fact("the user lives in Lyon", 2), Fact("likes tea", 3)))
    counter = count
    run(turn(conv(4)), composition, tiers=tiers)  # remembered
    if change == "tiers":
        tiers = Tiers(version=1, facts=(Fact("the user lives in Porto", 4),))
    elif change == "composition":
        composition = composition.model_copy(update={"facts": FactsTier(use=1)})
    elif change == "count":

        def counter(text: str) -> int:
            return tokens_per_word * count(text)

    context = run(turn(conv(4)), composition, tiers=tiers, counter=counter)
    text = memory_text(context)
    assert text is not None
    facts = [line for line in text.splitlines() if line.startswith("- ")]
    last_words = [fact.split()[-1].strip('"') for fact in facts]
    assert last_words == list(reversed(facts_sent))  # newest first
    assert context.messages[1].tokens == tokens_per_word * count(text) + TOKENS_PER_MESSAGE
    assert context.receipt.memory_sections["facts"] == sum(
        tokens_per_word * count(fact) for fact in facts
    )


# --- Recall fills the budget --------------------------------------------------------------

RECALL = PRESETS["hybrid-recall"]
DAY = 86_400.0
SAT = 1_705_104_000.0  # Sat 2024-01-13 00:00 UTC


def said(n: int, text: str, ts: float, role: str = "user") -> Message:
    # Counted as a recalled line costs with ``count``: its words and the speaker's label.
    return Message(role=role, content=text, index=n, tokens=count(text) + 1, ts=ts)


def recall_run(
    recalled: Sequence[Any],
    budget: int,
    composition: Composition = RECALL,
    prior: Sequence[Message] = (),
    now: float = SAT + 30 * DAY,
) -> Context:
    return assemble(
        turn(prior),
        tiers=Tiers(),
        pins=(),
        composition=composition,
        budget_tokens=budget,
        memory_role="system",
        count=count,
        recalled=recalled,
        now=now,
    )


def excerpts(context: Context) -> list[str]:
    memory = memory_text(context)
    assert memory is not None
    return memory.split("(verbatim)\n", 1)[1].splitlines()


def test_recall_takes_what_the_other_tiers_leave_best_first() -> None:
    from gateway.memory.assemble import Recalled

    hits = [Recalled(said(i, f"fact number {i} here", SAT + i * 60)) for i in (30, 10, 20, 40)]
    roomy = recall_run(hits, budget=10_000)
    assert roomy.receipt.recalled == ("30", "10", "20", "40")  # every hit, best first
    lengths = []
    # (From a little above what was sent: each line's cost is estimated on the safe side.)
    for budget in range(roomy.receipt.total_tokens + 10, 0, -1):
        kept = recall_run(hits, budget=budget).receipt
        assert kept.recalled == roomy.receipt.recalled[: len(kept.recalled)]
        assert kept.total_tokens <= budget or not kept.recalled
        lengths.append(len(kept.recalled))
    assert lengths == sorted(lengths, reverse=True)  # less room, fewer hits: the weakest go
    assert set(lengths) == {4, 3, 2, 1, 0}


def test_excerpts_are_shown_in_conversation_order_under_their_days() -> None:
    from gateway.memory.assemble import Recalled

    hits = [
        Recalled(said(41, "the blue drawer", SAT + DAY + 60, role="assistant")),
        Recalled(said(7, "my passport?", SAT + 3600)),
        Recalled(said(40, "where is it?", SAT + DAY)),
        Recalled(said(3, "hello there", SAT)),
    ]
    lines = excerpts(recall_run(hits, budget=10_000))
    assert lines == [
        "[Sat 2024-01-13]",
        "user: hello there",
        "…",
        "user: my passport?",
        "[Sun 2024-01-14]",
        "user: where is it?",
        "assistant: the blue drawer",
    ]


def test_a_short_hit_brings_the_message_it_answers_once() -> None:
    from gateway.memory.assemble import Recalled

    question = said(9, "how often were you in Turks and Caicos?", SAT)
    answer = said(10, "Twice!", SAT + 60, role="assistant")
    hits = [Recalled(answer, lead_in=question), Recalled(question)]
    context = recall_run(hits, budget=10_000)
    assert context.receipt.recalled == ("9", "10")
    assert excerpts(context)[1:] == [
        "user: how often were you in Turks and Caicos?",
        "assistant: Twice!",
    ]


def test_what_the_window_shows_is_not_recalled_again() -> None:
    from gateway.memory.assemble import Recalled

    window = conv(4)
    hits = [Recalled(window[-1]), Recalled(said(100, "an old fact", SAT))]
    context = recall_run(hits, budget=10_000, prior=window)
    assert context.receipt.recalled == ("100",)


def test_the_dates_line_names_today_and_the_window() -> None:
    from gateway.memory.assemble import Recalled

    window = tuple(m.but(ts=SAT + 2 * DAY + i) for m in conv(2) for i in (m.index,))
    hits = [Recalled(said(100, "an old fact", SAT))]
    memory = memory_text(recall_run(hits, budget=10_000, prior=window, now=SAT + 9 * DAY))
    assert memory is not None
    assert (
        "## Dates\nToday is Mon 2024-01-22 (UTC). The messages after this one were said " in memory
    )
    assert "said on Mon 2024-01-15." in memory


def test_the_optional_caps_bound_recall() -> None:
    from gateway.memory.assemble import Recalled

    hits = [Recalled(said(i, f"fact number {i} here", SAT)) for i in range(1, 20)]
    capped = RECALL.model_copy(update={"recall": RECALL.recall.model_copy(update={"hits": 3})})
    assert len(recall_run(hits, budget=10_000, composition=capped).receipt.recalled) == 3
    shared = RECALL.model_copy(update={"recall": RECALL.recall.model_copy(update={"share": 0.1})})
    context = recall_run(hits, budget=1_000, composition=shared)
    assert 0 < context.receipt.memory_sections["recall"] <= 100


def test_fallbacks_wait_for_recall_but_model_made_tiers_do_not() -> None:
    from gateway.memory.assemble import Recalled

    tiers = Tiers(
        summaries=(
            Summary(1, 15, "first lines of each message " * 5, fallback=True),
            Summary(16, 30, "what the model wrote", fallback=False),
        ),
        facts=(Fact("my seat is 14C", 3, 3, fallback=True),),
    )
    hits = [Recalled(said(i, f"fact number {i} here", SAT)) for i in range(40, 70)]
    plan = turn(conv(2))
    kwargs: dict[str, Any] = dict(tiers=tiers, pins=(), composition=RECALL, memory_role="system")
    roomy = assemble(plan, budget_tokens=10_000, count=count, recalled=hits, **kwargs)
    assert roomy.receipt.summaries == ((16, 30), (1, 15))  # room for all: all sent
    # Less room than everything needs (the fallback summary alone is 35 tokens here).
    budget = roomy.receipt.total_tokens - 25
    tight = assemble(plan, budget_tokens=budget, count=count, recalled=hits, **kwargs)
    assert tight.receipt.summaries == ((16, 30),)  # the fallback gave way, not recall
    assert tight.receipt.recalled == roomy.receipt.recalled


def test_model_made_summaries_and_facts_leave_recall_its_reserve() -> None:
    from gateway.memory.assemble import Recalled

    # Model-made gist worth far more than the budget: without the reserve it would take
    # everything and recall nothing (a 1,500-token budget against 3 summaries and 15
    # facts of a summarizer).
    tiers = Tiers(
        summaries=tuple(Summary(s, s + 14, "what the model wrote " * 60) for s in (1, 16, 31)),
        facts=tuple(Fact(f"fact {i} " * 20, i, i) for i in range(1, 16)),
    )
    hits = [Recalled(said(i, f"fact number {i} here", SAT)) for i in range(40, 600)]
    plan = turn(conv(2))
    kwargs: dict[str, Any] = dict(tiers=tiers, pins=(), memory_role="system", count=count)
    budget = 1_500
    recalled = []
    for reserve in (0.0, 0.5, 0.8):
        composition = RECALL.model_copy(
            update={"recall": RECALL.recall.model_copy(update={"reserve": reserve})}
        )
        context = assemble(
            plan, budget_tokens=budget, recalled=hits, composition=composition, **kwargs
        )
        sections = context.receipt.memory_sections
        gist = sections.get("summaries", 0) + sections.get("facts", 0)
        assert gist <= budget * (1 - reserve), (reserve, sections)
        assert context.receipt.total_tokens <= budget
        recalled.append(sections.get("recall", 0))
        if reserve:
            # Recall fills what the gist left (less the window's and the frame's share).
            assert sections["recall"] >= budget * reserve - 200, (reserve, sections)
            assert gist > 0  # and the gist still has its room
    assert recalled == sorted(recalled) and recalled[0] < recalled[1] < recalled[2], recalled


def test_lines_an_archive_keeps_make_the_context_lines_made_each_turn_make() -> None:
    """Issue 33: a recalled message's line is made once, by the archive it was found in;
    the context is the same to the byte, and so is its count (a word counter's, and the
    gateway's, which adds the block up from its lines)."""
    from gateway.memory.archive import Archive
    from gateway.memory.assemble import Recalled

    held = [
        said(i, f"fact number {i} here\n  and /its line {i}", SAT + i * 7_000) for i in range(1, 41)
    ]
    archive = Archive("g")
    archive.extend(held, [None] * len(held))
    other = Archive("g2")
    other.extend(held[:5], [None] * 5)
    hits = [Recalled(m, lead_in=held[m.index - 2] if m.index % 4 == 0 else None) for m in held]
    hits = hits[::-3] + [Recalled(m, "earlier") for m in held[:5]]
    kept = [hit._replace(archive=other if hit.session else archive) for hit in hits]
    kwargs: dict[str, Any] = dict(
        tiers=Tiers(facts=(Fact("my seat is 14C", 3, 3),)),
        pins=(),
        composition=RECALL,
        memory_role="system",
        now=SAT + 30 * DAY,
    )
    for counter in (count, TokenCounter().for_model("gpt-4o")):
        for budget in (10_000, 400, 180):
            made = assemble(
                turn(conv(2)), budget_tokens=budget, count=counter, recalled=hits, **kwargs
            )
            for _ in range(2):  # made by the archive, then found there
                found = assemble(
                    turn(conv(2)), budget_tokens=budget, count=counter, recalled=kept, **kwargs
                )
                assert found == made
            text = memory_text(made)
            assert (
                text is not None and made.messages[1].tokens == counter(text) + TOKENS_PER_MESSAGE
            )
            recalled = made.receipt.recalled
            assert recalled  # (and at 10,000, every hit: "earlier#5" the last)
            assert recalled[-1] == "earlier#5" or budget < 10_000


def test_a_receipt_says_what_the_upstream_can_reuse_before_the_budget() -> None:
    receipt = Receipt(tiers={"prompt": 7}, window_indexes=(), budget_tokens=100, stable=64)
    assert receipt.header() == "prompt=7;stable=64;budget=100"  # the budget stays last
    assert receipt.to_json()["stable_tokens"] == 64
