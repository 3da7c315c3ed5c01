"""Facts as keys to the messages they were read from: a question that matches a model's
fact finds the message the fact came from, though the two share no word."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.memory.fact_keys import MOST_FACTS, fact_lifts
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
    # By the share of the question the fact matches: "kevin" and "play" of three terms
    # that no message holds (so of equal idf).
    assert hits[0].score == pytest.approx(WORDS_ONLY.facts * 2 / 3)


def test_within_its_range_the_lift_goes_to_the_messages_that_hold_the_fact() -> None:
    archive = archive_of(TEXTS)
    fact = Fact("Kevin scored in the match his team won", start=13, end=15)
    lifts = fact_lifts(archive, [fact], build_query("Did Kevin's team win?").terms)
    assert lifts is not None
    # Message 13 holds "match", "won" and "scored"; 14 and 15 none of the fact's words.
    assert lifts[12] > 0 and lifts[13] == lifts[14] == 0.0
    assert not lifts[:12].any() and not lifts[15:].any()


@pytest.mark.parametrize(
    "fact",
    [
        Fact("Kevin plays football", start=13, end=15, fallback=True),  # the user's words
        Fact("Kevin plays football", start=13, end=15, superseded=True),
        Fact("Kevin plays football", start=40, end=45),  # messages the archive lacks
        Fact("Kevin plays football", start=1, end=80),  # too many to say which
        Fact("Kevin plays football", start=26, end=27),  # all in front of the model
        Fact("Kevin likes tea", start=13, end=15),  # no word of the question
    ],
    ids=["model-free", "superseded", "outside the archive", "a long range", "shown", "no match"],
)
def test_what_keys_nothing(fact: Fact) -> None:
    query = build_query("Which sport, football?")
    assert fact_lifts(archive_of(TEXTS), [fact], query.terms, exclude={26, 27}) is None


def test_a_fact_that_shares_only_the_name_asked_about_lifts_little() -> None:
    archive = archive_of(TEXTS)
    best = Fact("Kevin plays football for his club", start=13, end=15)
    name = Fact("Kevin planned the notes", start=1, end=1)
    lifts = fact_lifts(archive, [best, name], build_query("Kevin's football club").terms)
    assert lifts is not None
    assert lifts[12:15].tolist() == [1.0, 1.0, 1.0]  # all of the question
    assert lifts[0] == pytest.approx(1 / 3)  # a third of it (three terms of equal idf)
    assert not lifts[1:12].any() and not lifts[15:].any()


def test_a_shown_fact_does_not_crowd_out_one_the_model_has_not_seen() -> None:
    """Of more matching facts than lift anything, those whose messages are all shown
    already are passed over before the best are taken."""
    archive = archive_of(TEXTS)
    shown = [Fact("Kevin plays football", start=26, end=27) for _ in range(MOST_FACTS)]
    older = Fact("Kevin plays football", start=13, end=15)
    query = build_query("football").terms
    lifts = fact_lifts(archive, [older, *shown], query, exclude={26, 27})
    assert lifts is not None and lifts[12:15].tolist() == [1.0, 1.0, 1.0]


def test_with_no_weight_facts_lift_nothing() -> None:
    archive = archive_of(TEXTS)
    query = build_query(QUESTION)
    source = Source(archive, fact_lifts=fact_lifts(archive, [SPORT], query.terms))
    assert not rank([source], query, limit=5, weights=replace(WORDS_ONLY, facts=0.0))


def test_what_a_facts_messages_hold_is_kept_with_the_archive_until_they_change() -> None:
    archive = archive_of(TEXTS)
    fact = Fact("Kevin scored in the match his team won", start=13, end=15)
    query = build_query("Did Kevin's team win?").terms
    first = fact_lifts(archive, [fact], query)
    assert list(archive.held_of_facts.values()) == [(3, 0, 0)]  # "match", "won", "scored"
    archive.held_of_facts[next(iter(archive.held_of_facts))] = (0, 1, 0)  # (kept: read back)
    kept = fact_lifts(archive, [fact], query)
    assert first is not None and kept is not None and kept[13] > 0 == kept[12]
    archive.truncate(14)  # a regenerate replaced message 15: what was kept is forgotten
    assert archive.held_of_facts == {}
    again = fact_lifts(archive, [fact], query)
    assert again is not None and again[12] > 0
