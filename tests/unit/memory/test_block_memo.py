"""The memory block's items of a session's tiers are remembered on the tiers value, keyed
by everything else they are made of: found again for the same inputs, never for others."""

from __future__ import annotations

from dataclasses import replace

from gateway.memory.block import TierShape, memory_items, tier_items
from gateway.memory.model import DERIVED_ENTRIES, Fact, KeyQA, RollingSummary, Summary, Tiers
from gateway.presets import PRESETS, ChunkTier, Composition, FactsTier, WindowTier

COMPOSITION = Composition(
    window=WindowTier(messages=4),
    chunks=ChunkTier(use=2),
    facts=FactsTier(use=2),
    priority=["window_keep", "summaries", "facts", "window"],
)


def tiers() -> Tiers:
    return Tiers(
        version=3,
        summaries=tuple(Summary(i * 10 + 1, i * 10 + 10, f"part {i}") for i in range(3)),
        facts=(Fact("likes tea"), Fact("lives in Lyon"), Fact("has a cat")),
        rolling=RollingSummary(1, 30, "so far"),
        key_qa=(KeyQA("q?", "a."),),
    )


class Counting:
    """A token counter (one a word) that counts its calls."""

    def __init__(self, per_word: int = 1) -> None:
        self.per_word = per_word
        self.calls = 0

    def __call__(self, text: str) -> int:
        self.calls += 1
        return len(text.split()) * self.per_word


def texts(items: dict[str, tuple[object, ...]]) -> dict[str, list[str]]:
    return {name: [item.text for item in section] for name, section in items.items() if section}  # type: ignore[attr-defined]


def test_the_same_tiers_composition_and_counter_are_made_once() -> None:
    value, count = tiers(), Counting()
    first = tier_items(value, COMPOSITION, count)
    made = count.calls
    assert made > 0
    assert tier_items(value, COMPOSITION, count) is first
    assert count.calls == made  # nothing counted again
    assert texts(first) == {
        "facts": ['- from the user\'s messages: "has a cat"', "- from the user's messages: "
                  '"lives in Lyon"'],
        "summaries": ["### Messages 21-30\n> part 2", "### Messages 11-20\n> part 1"],
    }  # fmt: skip


def test_an_equal_composition_with_the_same_shape_finds_them_again() -> None:
    value, count = tiers(), Counting()
    first = tier_items(value, COMPOSITION, count)
    # Another object, and another priority: nothing the tier items are made of.
    other = COMPOSITION.model_copy(update={"priority": ["window_keep", "window"]})
    assert other is not COMPOSITION and TierShape.of(other) == TierShape.of(COMPOSITION)
    assert tier_items(value, other, count) is first


def test_a_composition_of_another_shape_gets_its_own_items() -> None:
    value, count = tiers(), Counting()
    two = tier_items(value, COMPOSITION, count)
    one_fact = COMPOSITION.model_copy(update={"facts": FactsTier(use=1)})
    one = tier_items(value, one_fact, count)
    assert len(two["facts"]) == 2 and len(one["facts"]) == 1
    dated = COMPOSITION.model_copy(update={"dates": True})
    assert tier_items(value, dated, count) is not two
    # Each is still found again, each by its own key.
    assert tier_items(value, COMPOSITION, count) is two
    assert tier_items(value, one_fact, count) is one


def test_another_counter_counts_its_own_tokens() -> None:
    value = tiers()
    single, double = Counting(1), Counting(2)
    by_single = tier_items(value, COMPOSITION, single)
    by_double = tier_items(value, COMPOSITION, double)
    assert double.calls > 0
    assert [i.tokens * 2 for i in by_single["facts"]] == [i.tokens for i in by_double["facts"]]


def test_an_equal_but_separate_tiers_value_is_made_again_to_the_same_items() -> None:
    count = Counting()
    first = tier_items(tiers(), COMPOSITION, count)
    made = count.calls
    again = tier_items(tiers(), COMPOSITION, count)  # equal, parsed again: not the same object
    assert again is not first and again == first
    assert count.calls == 2 * made


def test_changed_tiers_never_see_the_items_of_the_value_they_were_copied_from() -> None:
    value, count = tiers(), Counting()
    before = tier_items(value, COMPOSITION, count)
    changed = replace(value, version=4, facts=(*value.facts, Fact("plays chess")))
    after = tier_items(changed, COMPOSITION, count)
    assert after["facts"][0].text.endswith('"plays chess"')
    assert before["facts"][0].text.endswith('"has a cat"')


def test_what_is_remembered_is_no_part_of_the_tiers_value() -> None:
    value = tiers()
    tier_items(value, COMPOSITION, Counting())
    assert len(value.derived) == 1
    assert value == tiers() and hash(value) == hash(tiers())
    assert "derived" not in repr(value)


def test_a_tiers_value_keeps_a_bounded_number_of_derived_entries() -> None:
    value = tiers()
    counters = [Counting() for _ in range(DERIVED_ENTRIES + 3)]
    for count in counters:
        tier_items(value, COMPOSITION, count)
    assert len(value.derived) == DERIVED_ENTRIES
    newest = tier_items(value, COMPOSITION, counters[-1])
    assert tier_items(value, COMPOSITION, counters[-1]) is newest


def test_memory_items_do_not_change_what_is_remembered() -> None:
    """memory_items adds the per-request sections to a copy, never to the kept items."""
    value, count = tiers(), Counting()
    composition = PRESETS["hybrid"]
    kept = tier_items(value, composition, count)
    snapshot = {name: tuple(section) for name, section in kept.items()}
    items = memory_items(value, (), composition, count, {"summary": "earlier", "facts": ["x"]})
    assert "pins" in items
    assert tier_items(value, composition, count) is kept and kept == snapshot
