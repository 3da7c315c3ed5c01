"""Durable facts: keys, extraction, supersession (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.memory import durable
from gateway.memory.durable import Found, current, extract, key_of, keyed, merge, union
from gateway.memory.model import Fact, Message


@pytest.mark.parametrize(
    ("sentence", "key"),
    [
        ("My seat is 14C.", "seat"),
        ("Change of plan: my seat is 22A now.", "seat"),
        ("My dentist appointment is on 14 March.", "dentist appointment"),
        ("I'm allergic to penicillin.", "allergy"),
        ("Call me Ada.", "name"),
        ("I prefer aisle seats.", "prefer:aisle seats"),
        ("Never schedule anything before 10am.", "rule:never schedule before"),
        ("Actually, from now on never schedule anything before 9am.", "rule:never schedule before"),
        ("I live in Porto.", "lives"),
        ("The weather is nice.", None),
        ("What is my seat?", None),  # a question states no fact
    ],
)
def test_keys(sentence: str, key: str | None) -> None:
    assert key_of(sentence) == key


def test_extract_reads_only_the_users_own_words() -> None:
    messages = [
        Message("user", "Hello. My seat is 14C. The weather is nice.", index=1),
        Message("assistant", "Noted: your seat is 14C and my name is Bot.", index=2),
    ]
    # Read without a model from the user's own words: marked as such.
    assert extract(messages) == [Found("seat", "My seat is 14C.", 1, fallback=True)]


def test_newer_fact_supersedes_older_and_duplicates_are_ignored() -> None:
    facts = merge((), [Found("seat", "My seat is 14C.", 3)], keep=10)
    facts = merge(facts, [Found("seat", "my seat is 14C", 9)], keep=10)  # said again
    assert len(facts) == 1
    facts = merge(facts, [Found("seat", "My seat is 22A now.", 41)], keep=10)
    assert [(f.text, f.superseded) for f in facts] == [
        ("My seat is 14C.", True),
        ("My seat is 22A now.", False),
    ]
    assert [f.text for f in current(facts)] == ["My seat is 22A now."]


def test_keep_drops_superseded_facts_before_current_ones() -> None:
    facts = merge((), [Found(f"k{i}", f"fact {i}", i) for i in range(3)], keep=3)
    facts = merge(facts, [Found("k0", "fact 0 changed", 9)], keep=3)
    assert [f.text for f in facts] == ["fact 1", "fact 2", "fact 0 changed"]


def test_keyed_model_facts_and_union_across_sessions() -> None:
    found = keyed(["My seat is 3B.", "Loves hiking in the Alps"], 1, 20)
    assert [(f.key, f.start, f.index) for f in found] == [
        ("seat", 1, 20),
        ("loves hiking in the alps", 1, 20),
    ]
    older, newer = ["My seat is 3B.", "I prefer tea."], ["My seat is 7F."]
    assert union([older, newer], keep=10) == ["I prefer tea.", "My seat is 7F."]


# --- Facts corrected and deleted through the memory API ----------------------------------


def test_a_correction_supersedes_the_fact_and_keeps_its_key_and_sources() -> None:
    facts = durable.merge((), [durable.Found("seat", "My seat is 42B.", 3, 1, ts=5.0)], keep=10)
    (old,) = facts
    fixed = durable.correct(facts, 0, "My seat is 17C.", now=9.0)
    assert fixed[0] == replace(old, superseded=True)
    assert fixed[1] == Fact("My seat is 17C.", 1, 3, key="seat", ts=9.0, corrected=True)
    assert durable.fact_id(fixed[1]) != durable.fact_id(old)
    assert durable.find(fixed, durable.fact_id(old)) == 0
    assert Fact.from_data(fixed[1].to_data()) == fixed[1]  # stored and read back


def test_what_a_correction_replaced_does_not_come_back_but_a_new_value_does() -> None:
    facts = durable.merge((), [durable.Found("seat", "My seat is 42B.", 3)], keep=10)
    fixed = durable.correct(facts, 0, "My seat is 17C.", now=9.0)
    again = durable.merge(fixed, [durable.Found("seat", "my seat is 42B", 8)], keep=10)
    assert [f.text for f in durable.current(again)] == ["My seat is 17C."]
    newer = durable.merge(fixed, [durable.Found("seat", "My seat is 3A.", 8)], keep=10)
    assert [f.text for f in durable.current(newer)] == ["My seat is 3A."]


def test_a_deleted_fact_is_gone_not_superseded() -> None:
    found = [
        durable.Found("seat", "My seat is 42B.", 3),
        durable.Found("lives", "I live in Lyon", 4),
    ]
    facts = durable.merge((), found, keep=10)
    assert [f.text for f in durable.without(facts, 0)] == ["I live in Lyon"]
    assert durable.find(facts, "fact_unknown") is None
