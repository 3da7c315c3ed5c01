"""Who a question is about: the speakers' names (``Message.name``) it names, and the lift
recall gives their messages (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.memory.archive import Archive
from gateway.memory.model import Message
from gateway.memory.recall import Source, Weights, build_query, rank
from gateway.memory.speakers import SpeakerIndex, parts

# Words only, and the speaker's lift: what a test below ranks by.
LIFT = Weights(semantic=0.0, neighbour=0.0, date_boost=0.0, feedback=0.0, around=0.0, spread=False)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Kate", {"kate"}),
        ("Fahim_Khan", {"fahim", "khan"}),
        ("fahim.khan", {"fahim", "khan"}),
        ("Fahim-Khan", {"fahim", "khan"}),
        ("FahimKhan", {"fahim", "khan"}),
        ("O'Brien", {"brien"}),  # one letter names no one
        ("Ren\u00e9e", {"ren\u00e9e", "renee"}),  # Latin letters also without accents
        ("Rene\u0301e", {"ren\u00e9e", "renee"}),  # composed (NFC) as it was sent apart
        (
            "\u0932\u0941\u0915\u093e\u0938",
            {"\u0932\u0941\u0915\u093e\u0938"},
        ),  # with its vowel signs
        ("\u674e\u96f7", {"\u674e\u96f7"}),
        ("GPT-4o", {"gpt"}),  # nor does a number
        ("agent-7", {"agent"}),
        ("", set()),
    ],
)
def test_a_name_is_said_by_its_parts(name: str, expected: set[str]) -> None:
    assert parts(name) == expected


@pytest.mark.parametrize(
    ("question", "named"),
    [
        ("What are Kate's hobbies?", {"kate"}),
        ("what are kate\u2019s hobbies?", {"kate"}),  # any case, a curly apostrophe
        ("Where does Fahim work?", {"fahim_khan", "fahimkhan"}),  # two: no one lifted
        ("What did Fahim-Khan say?", {"fahim_khan", "fahimkhan"}),
        ("What did O'Brien order?", {"o'brien"}),
        ("Where does Ren\u00e9e live?", {"ren\u00e9e"}),
        ("Where does Renee live?", {"ren\u00e9e"}),
        ("Where does Jos\u00e9 live?", {"jose"}),
        ("What did FahimKhan say?", {"fahim_khan", "fahimkhan"}),
        ("What did fahimkhan say?", {"fahimkhan"}),  # the name unsplit, as typed
        ("Which cities have both Kate and Elise been to?", {"kate", "elise"}),
        ("What did we plan for the weekend?", set()),
        ("Will the weather hold?", set()),  # a stopword names no one, not even Will
        ("Was it 4 or 5?", set()),
        ("", set()),
    ],
)
def test_a_question_names_speakers_by_the_parts_of_their_names(
    question: str, named: set[str]
) -> None:
    index = SpeakerIndex()
    names = ["Kate", "Elise", "Fahim_Khan", "Will", "O'Brien", "Ren\u00e9e", "GPT-4o", "Jose"]
    names.append("FahimKhan")  # its parts are read from it as sent, not case-folded
    for position, name in enumerate(names):
        index.add("user", name, position)
    assert index.named(parts(question), enough=10) == named


def test_many_names_are_looked_up_and_the_lookup_stops_at_two() -> None:
    """A client may name each message differently: the question's parts are looked up,
    two names found are enough (no one is lifted), and what each name costs is counted."""
    index = SpeakerIndex()
    cost = sum(index.add("user", f"guest{n}", n) for n in range(20_000))
    assert cost >= 20_000 * 300
    assert len(index.named(parts("What did guest say?"))) == 2
    assert [list(found) for found in index.of("guest7")] == [[7]]


def test_a_name_is_read_to_the_chat_apis_64_characters() -> None:
    """A longer name is its first 64 characters: the user's second name here, so the
    role's unnamed message is no one's; what the message holds is counted."""
    long = "Kat" + "x" * 100_000
    archive = archive_of([("user", "Kate", "a"), ("user", long, "b"), ("user", None, "c")])
    assert archive.speakers.names() == {"kate", long[:64].casefold()}
    assert [list(found) for found in archive.speakers.of("kate")] == [[0]]
    alone = archive_of([("user", "Kate", "a"), ("user", None, "c")])
    # The message's whole name, the index's 64 characters twice (key and spelling), and a
    # message's and a speaker's overheads.
    assert archive.nbytes - alone.nbytes == len("b") + len(long) + 2 * 64 + 400 + 132 + 300


def test_one_name_in_two_cases_is_one_speaker() -> None:
    archive = archive_of([("user", "Kate", "a"), ("user", "kate", "b"), ("user", None, "c")])
    assert archive.speakers.named(parts("What did Kate say?")) == {"kate"}
    assert [list(found) for found in archive.speakers.of("kate")] == [[0, 1], [2]]


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
    both = build_query("What hobbies do Kate and Elise share?")
    assert [h.index for h in rank([Source(archive)], both, limit=4, weights=LIFT)] == [2]
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
    assert archive.speakers.names() == {"kate", "elise"}
    assert [list(found) for found in archive.speakers.of("kate")] == [[0], [2]]
    group = archive_of([("user", "Kate", "a"), ("user", "Liam", "b"), ("user", None, "c")])
    assert [list(found) for found in group.speakers.of("kate")] == [[0]]


def test_a_tools_name_names_no_speaker() -> None:
    archive = archive_of([("user", None, "weather?"), ("function", "get_weather", "sunny")])
    assert archive.speakers.names() == set()
    hits = rank([Source(archive)], build_query("get weather"), limit=2, weights=LIFT)
    assert [h.index for h in hits] == [1]  # the result is not lifted as get_weather's


def test_a_regenerate_forgets_the_speakers_of_what_it_replaced() -> None:
    said = [("user", "Kate", "a"), ("assistant", "Elise", "b"), ("user", "Kate", "c")]
    archive = archive_of([*said, ("user", "Liam", "d"), ("user", "Kate", "e")])
    archive.truncate(3)  # two of Kate's and one of Liam's gone
    assert archive.nbytes == archive_of(said).nbytes
    assert archive.speakers.names() == {"kate", "elise"}
    assert archive.speakers.named(["liam"]) == set()
    assert [list(found) for found in archive.speakers.of("kate")] == [[0, 2]]
    archive.extend([Message("user", "f", name="Liam", index=4)], [None])  # said again
    assert archive.speakers.named(["liam"]) == {"liam"}
    assert [list(found) for found in archive.speakers.of("liam")] == [[3]]
    archive.truncate(0)
    assert archive.speakers.positions == {}
    assert archive.speakers.named(["kate"]) == set()


def test_a_speaker_of_another_session_is_lifted_there_too() -> None:
    here = archive_of([("user", "Kate", "hello there"), ("assistant", "Elise", "hi")])
    there = archive_of([("user", "kate", "I love skiing"), ("assistant", "Elise", "nice")])
    query = build_query("What does Kate like?")
    hits = rank([Source(here), Source(there)], query, limit=4, weights=LIFT)
    assert {(h.source, h.index) for h in hits} == {(0, 1), (1, 1)}


def test_a_speaker_named_only_in_another_session_is_found_there() -> None:
    here = archive_of([("user", None, "hello there"), ("assistant", None, "hi")])
    there = archive_of([("user", "Kate", "I love skiing"), ("assistant", "Elise", "nice")])
    hits = rank([Source(here), Source(there)], build_query("Kate?"), limit=4, weights=LIFT)
    assert [(h.source, h.index) for h in hits] == [(1, 1)]


def test_two_speakers_named_in_two_sessions_lift_no_one() -> None:
    here = archive_of([("user", "Kate", "hello there"), ("assistant", None, "hi")])
    there = archive_of([("user", "Liam", "I love skiing"), ("assistant", None, "nice")])
    query = build_query("What do Kate and Liam like?")
    assert rank([Source(here), Source(there)], query, limit=4, weights=LIFT) == []
