"""Facts as keys to the messages they were read from: a question that matches a model's
fact finds the message the fact came from, though the two share no word."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.memory.fact_keys import fact_lifts
from gateway.memory.model import Fact
from gateway.memory.recall import Source, build_query, rank
from tests.unit.memory.test_recall import WORDS_ONLY, archive_of

FILLER = [f"the weekly planning notes, part {i}" for i in range(12)]
TEXTS = [
    *FILLER,
    "Had a match today, we won 2-1 and I scored!",  # 13
    "Congrats! Was it a league game?",  # 14
    "Yes, the regional league, away from home",  # 15
    *FILLER,
]
SPORT = Fact("Kevin plays football", start=13, end=15)
QUESTION = "What sports does Kevin play?"


def test_a_question_matching_a_models_fact_finds_the_message_it_was_read_from() -> None:
    archive = archive_of(TEXTS)
    query = build_query(QUESTION)
    assert not rank([Source(archive)], query, limit=5, weights=WORDS_ONLY)  # no word shared
    lifts = fact_lifts(archive, [SPORT], query.terms)
    assert lifts is not None
    hits = rank([Source(archive, fact_lifts=lifts)], query, limit=5, weights=WORDS_ONLY)
    # All of the range alike: none of its messages holds a word of the fact's.
    assert [h.index for h in hits] == [15, 14, 13]
    assert hits[0].score == pytest.approx(WORDS_ONLY.facts)


def test_within_its_range_the_lift_goes_to_the_messages_that_hold_the_fact() -> None:
    archive = archive_of(TEXTS)
    fact = Fact("Kevin scored in the match his team won", start=13, end=15)
    lifts = fact_lifts(archive, [fact], build_query("Did Kevin's team win?").terms)
    assert lifts is not None
    # Message 13 holds "match", "won" and "scored"; 14 and 15 none of the fact's words.
    assert lifts[12] == 1.0 and lifts[13] == lifts[14] == 0.0
    assert not lifts[:12].any() and not lifts[15:].any()


@pytest.mark.parametrize(
    "fact",
    [
        Fact("Kevin plays football", start=13, end=15, fallback=True),  # the user's words
        Fact("Kevin plays football", start=13, end=15, superseded=True),
        Fact("Kevin plays football", start=40, end=45),  # messages the archive lacks
        Fact("Kevin plays football", start=1, end=80),  # too many to say which
        Fact("Kevin likes tea", start=13, end=15),  # no word of the question
    ],
    ids=["model-free", "superseded", "outside the archive", "a long range", "no match"],
)
def test_what_keys_nothing(fact: Fact) -> None:
    query = build_query("Which sport, football?")
    assert fact_lifts(archive_of(TEXTS), [fact], query.terms) is None


def test_the_best_matching_fact_counts_one_and_a_weaker_one_less() -> None:
    archive = archive_of(TEXTS)
    weaker = Fact("Kevin planned the notes", start=1, end=1)
    lifts = fact_lifts(archive, [SPORT, weaker], build_query("Kevin football").terms)
    assert lifts is not None
    assert lifts[12:15].tolist() == [1.0, 1.0, 1.0] and 0 < lifts[0] < 1
    assert not lifts[1:12].any() and not lifts[15:].any()


def test_with_no_weight_facts_lift_nothing() -> None:
    archive = archive_of(TEXTS)
    query = build_query(QUESTION)
    source = Source(archive, fact_lifts=fact_lifts(archive, [SPORT], query.terms))
    assert not rank([source], query, limit=5, weights=replace(WORDS_ONLY, facts=0.0))


def test_a_fact_matching_under_half_as_well_as_the_best_lifts_nothing() -> None:
    archive = archive_of(TEXTS)
    best = Fact("Kevin plays football for his club", start=13, end=15)
    weak = Fact("Kevin planned the notes", start=1, end=1)  # shares only the name
    lifts = fact_lifts(archive, [best, weak], build_query("Kevin's football club").terms)
    assert lifts is not None
    assert lifts[0] == 0 and lifts[12:15].tolist() == [1.0, 1.0, 1.0]
