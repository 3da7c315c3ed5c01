"""Who a question is about: the speakers' names (``Message.name``) it names, and the lift
recall gives their messages (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.memory.archive import Archive
from gateway.memory.model import Message
from gateway.memory.recall import Source, Weights, build_query, rank
from gateway.memory.speakers import name_parts, named_speaker
from gateway.memory.terms import words

# Words only, and the speaker's lift: what a test below ranks by.
LIFT = Weights(semantic=0.0, neighbour=0.0, date_boost=0.0, feedback=0.0, around=0.0, spread=False)


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("Kate", {"kate"}),
        ("Fahim_Khan", {"fahim", "khan"}),
        ("fahim.khan", {"fahim", "khan"}),
        ("FahimKhan", {"fahim", "khan"}),
        ("JSmith", {"j", "smith"}),
        ("agent-7", {"agent", "7"}),
        ("", set()),
    ],
)
def test_a_name_is_said_by_its_parts(name: str, parts: set[str]) -> None:
    assert name_parts(name) == parts


@pytest.mark.parametrize(
    ("question", "named"),
    [
        ("What are Kate's hobbies?", "Kate"),
        ("what are kate\u2019s hobbies?", "Kate"),  # any case, a curly apostrophe
        ("Where does Fahim work?", "Fahim_Khan"),
        ("Which cities have both Kate and Elise been to?", None),  # two: about both
        ("What did we plan for the weekend?", None),
        ("Will the weather hold?", None),  # a stopword names no one, not even Will
        ("", None),
    ],
)
def test_a_question_names_one_speaker_or_none(question: str, named: str | None) -> None:
    assert named_speaker(words(question), ["Kate", "Elise", "Fahim_Khan", "Will"]) == named


def archive_of(said: list[tuple[str, str | None, str]]) -> Archive:
    archive = Archive("g")
    messages = [
        Message(role, text, name=name, index=i + 1) for i, (role, name, text) in enumerate(said)
    ]
    archive.extend(messages, [None] * len(messages))
    return archive


def test_the_named_speakers_messages_rank_first() -> None:
    archive = archive_of([
        ("user", "Kate", "I went skiing all weekend."),
        ("assistant", "Elise", "My hobbies are mostly painting."),
        ("user", "Kate", "Then a cooking class on Sunday."),
        ("assistant", "Elise", "Sounds like a busy weekend."),
    ])  # fmt: skip
    hits = rank([Source(archive)], build_query("What are Kate's hobbies?"), limit=4, weights=LIFT)
    # Elise's words match "hobbies" (0.6 of the score at most, with meaning's share); every
    # message of Kate's is lifted by 0.3, and here outranks Elise's other one.
    assert [h.index for h in hits] == [2, 3, 1]
    lifted = [h.score for h in hits if h.index in (1, 3)]
    assert lifted == [0.3, 0.3]
    off = replace(LIFT, speaker=0.0)
    hits = rank([Source(archive)], build_query("Kate's hobbies"), limit=4, weights=off)
    assert [h.index for h in hits] == [2]


def test_a_roles_unnamed_messages_are_its_one_named_speakers() -> None:
    """Named on import, then unnamed: the client's later turns are still Kate's. A role
    with two names leaves its unnamed messages to no one."""
    archive = archive_of([
        ("user", "Kate", "hello"),
        ("assistant", "Elise", "hi"),
        ("user", None, "I went skiing"),
        ("assistant", None, "nice"),
    ])  # fmt: skip
    assert archive.speaker_names() == {"Kate", "Elise"}
    assert sorted(p for found in archive.speaker_positions("Kate") for p in found) == [0, 2]
    group = archive_of([("user", "Kate", "a"), ("user", "Liam", "b"), ("user", None, "c")])
    assert [list(found) for found in group.speaker_positions("Kate")] == [[0]]


def test_a_tools_name_names_no_speaker() -> None:
    archive = archive_of([("user", None, "weather?"), ("function", "get_weather", "sunny")])
    assert archive.speaker_names() == set()
    hits = rank([Source(archive)], build_query("get weather"), limit=2, weights=LIFT)
    assert [h.index for h in hits] == [1]  # the result is not lifted as get_weather's


def test_a_regenerate_forgets_the_speakers_of_what_it_replaced() -> None:
    archive = archive_of(
        [("user", "Kate", "a"), ("assistant", "Elise", "b"), ("user", "Liam", "c")]
    )
    archive.truncate(2)
    assert archive.speaker_names() == {"Kate", "Elise"}
    assert [list(found) for found in archive.speaker_positions("Kate")] == [[0]]
    archive.truncate(0)
    assert archive.speakers == {}


def test_a_speaker_of_another_session_is_lifted_there_too() -> None:
    here = archive_of([("user", "Kate", "hello there"), ("assistant", "Elise", "hi")])
    there = archive_of([("user", "Kate", "I love skiing"), ("assistant", "Elise", "nice")])
    query = build_query("What does Kate like?")
    hits = rank([Source(here), Source(there)], query, limit=4, weights=LIFT)
    assert {(h.source, h.index) for h in hits} == {(0, 1), (1, 1)}
