"""Summarization jobs: when each preset's jobs are due (the seeds' numbers).

``schedule`` is checked against the seeds and DESIGN.md's preset table.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.memory.jobs import Job, schedule
from gateway.memory.model import Message
from gateway.presets import PRESETS, ChunkTier, Composition, RecursiveTier
from tests.support.conversation import a, conv, in_one_batch, one_at_a_time, ranges, t, u, users

ROLLING_WINDOW = PRESETS["rolling-window"]
RECURSIVE = PRESETS["recursive-summary"]
ROLLING = PRESETS["rolling-summary"]
PROGRESSIVE = PRESETS["progressive"]
HYBRID = PRESETS["hybrid"]


# --- schedule: each preset as its seed writes it -------------------------------------------


@pytest.mark.parametrize(
    ("composition", "n", "kind", "expected"),
    [
        # Seed 000: at 22 summarize 2-22, then 23-43, 44-64, 65-85 (n-20 … n).
        pytest.param(ROLLING_WINDOW, 21, "chunk", [], id="000 nothing before 22"),
        pytest.param(ROLLING_WINDOW, 22, "chunk", [(2, 22, 22)], id="000 at 22"),
        pytest.param(ROLLING_WINDOW, 85, "chunk",
                     [(2, 22, 22), (23, 43, 43), (44, 64, 64), (65, 85, 85)], id="000 to 85"),
        # Seed 001: at 11 messages 1-10; at 21 messages 2-11; at 31 messages 12-21.
        pytest.param(RECURSIVE, 10, "recursive", [], id="001 nothing before 11"),
        pytest.param(RECURSIVE, 41, "recursive",
                     [(1, 10, 11), (2, 11, 21), (12, 21, 31), (22, 31, 41)], id="001 to 41"),
        # Seed 003: ten turns buffered (20 messages): the oldest eight (16 messages) go.
        pytest.param(PROGRESSIVE, 19, "chunk", [], id="003 nothing before 20"),
        pytest.param(PROGRESSIVE, 52, "chunk", [(1, 16, 20), (17, 32, 36), (33, 48, 52)],
                     id="003 to 52"),
        # Seed 004: every 15 messages, the 15 since the last summary.
        pytest.param(HYBRID, 14, "chunk", [], id="004 nothing before 15"),
        pytest.param(HYBRID, 45, "chunk", [(1, 15, 15), (16, 30, 30), (31, 45, 45)],
                     id="004 to 45"),
    ],
)  # fmt: skip
def test_message_count_triggers(
    composition: Composition, n: int, kind: str, expected: list[tuple[int, int, int]]
) -> None:
    for jobs in (in_one_batch(composition, conv(n)), one_at_a_time(composition, conv(n))):
        assert ranges(jobs) == expected
        assert {job.kind for job in jobs} <= {kind}
        assert all(job.turn == 0 for job in jobs)


def test_chunk_ranges_never_start_before_the_first_message() -> None:
    composition = Composition(chunks=ChunkTier(first_at=5, every=10, size=10))
    assert ranges(in_one_batch(composition, conv(25))) == [(1, 5, 5), (6, 15, 15), (16, 25, 25)]


def test_recursive_with_other_numbers() -> None:
    composition = Composition(recursive=RecursiveTier(first_at=5, every=4, lag=4))
    assert ranges(in_one_batch(composition, conv(13))) == [(1, 4, 5), (2, 5, 9), (6, 9, 13)]


def rolling_expected(turns: int) -> list[Job]:
    """Seed 002 over alternating turns: turn t is user 2t-1, answer 2t."""
    jobs = []
    for turn in range(1, turns + 1):
        q, answer = 2 * turn - 1, 2 * turn
        if turn > 6 and turn % 4 == 0:
            start = 1 if turn == 8 else 2 * (turn - 3) - 1  # the first compression takes all
            jobs.append(Job("compress", start, answer, answer, turn, q))
        else:
            jobs.append(Job("fold", q, answer, answer, turn, q))
    return jobs


def test_rolling_summary_one_job_per_answered_turn() -> None:
    jobs = in_one_batch(ROLLING, conv(34))
    assert jobs == rolling_expected(17)
    assert [job.turn for job in jobs if job.kind == "compress"] == [8, 12, 16]
    assert [(j.start, j.end) for j in jobs if j.kind == "compress"] == [(1, 16), (17, 24), (25, 32)]
    assert one_at_a_time(ROLLING, conv(34)) == jobs


def test_rolling_summary_no_job_for_an_unanswered_question() -> None:
    assert in_one_batch(ROLLING, conv(15)) == rolling_expected(7)  # u15 is not answered yet
    messages = [u(1), u(2), a(3)]  # the first question was never answered
    assert in_one_batch(ROLLING, messages) == [Job("fold", 2, 3, 3, 2, 2)]


def test_rolling_summary_turns_are_counted_across_calls() -> None:
    # The service passes the loaded tail plus what it appended, and the turns stored before.
    messages = conv(40)
    jobs: list[Job] = []
    for end in range(2, 41, 2):  # each turn recorded as question + answer
        before = end - 2
        history = messages[max(0, before - 8) : end]
        jobs += schedule(
            ROLLING, history, count_before=before, turns_before=users(messages[:before])
        )
    assert jobs == rolling_expected(20)


def test_rolling_summary_turns_continue_from_turns_before() -> None:
    # 100 turns (200 messages) were stored before; the tail starts at message 195.
    tail = [u(i) if i % 2 else a(i) for i in range(195, 201)]
    appended = [u(201), a(202)]
    jobs = schedule(ROLLING, [*tail, *appended], count_before=200, turns_before=100)
    assert jobs == [Job("fold", 201, 202, 202, 101, 201)]
    appended = [u(i) if i % 2 else a(i) for i in range(201, 209)]  # turns 101-104
    jobs = schedule(ROLLING, [*tail, *appended], count_before=200, turns_before=100)
    assert [(j.kind, j.turn) for j in jobs] == [
        ("fold", 101),
        ("fold", 102),
        ("fold", 103),
        ("compress", 104),
    ]
    assert (jobs[-1].start, jobs[-1].end, jobs[-1].question) == (201, 208, 207)


CALL = ("c1",)


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        pytest.param([u(1), a(2, CALL), t(3, "c1"), a(4)], [Job("fold", 1, 4, 4, 1, 1)],
                     id="call, result, answer"),
        pytest.param([u(1), a(2, CALL, "Let me check."), t(3, "c1"), a(4)],
                     [Job("fold", 1, 4, 4, 1, 1)], id="a call with text is not the answer"),
        pytest.param([u(1), a(2, ("c1", "c2")), t(3, "c1"), t(4, "c2"), a(5), u(6), a(7)],
                     [Job("fold", 1, 5, 5, 1, 1), Job("fold", 6, 7, 7, 2, 6)],
                     id="two results"),
        pytest.param([u(1), a(2, CALL), t(3, "c1"), a(4, ("c2",)), t(5, "c2"), a(6)],
                     [Job("fold", 1, 6, 6, 1, 1)], id="chained calls"),
        pytest.param([u(1), a(2, CALL), t(3, "c1")], [], id="results not answered yet"),
        pytest.param([u(1), a(2, CALL), t(3, "c1"), u(4), a(5)], [Job("fold", 4, 5, 5, 2, 4)],
                     id="abandoned tool turn"),
        pytest.param([u(1), a(2), a(3)], [Job("fold", 1, 2, 2, 1, 1)],
                     id="a second answer is not a second turn"),
        pytest.param([u(1), a(2, content="")], [], id="an empty answer is no answer"),
    ],
)  # fmt: skip
def test_rolling_summary_tool_call_chains(messages: list[Message], expected: list[Job]) -> None:
    assert in_one_batch(ROLLING, messages) == expected
    assert one_at_a_time(ROLLING, messages) == expected


def test_message_triggers_count_tool_messages() -> None:
    messages = [u(1), a(2, ("c1", "c2")), t(3, "c1"), t(4, "c2"), *conv(30)[4:]]
    assert ranges(in_one_batch(HYBRID, messages)) == [(1, 15, 15), (16, 30, 30)]


def test_nothing_appended_nothing_due() -> None:
    for composition in PRESETS.values():
        assert schedule(composition, conv(30), count_before=30, turns_before=15) == []
        assert schedule(composition, [], count_before=0, turns_before=0) == []


def test_job_identity_and_round_trip() -> None:
    job = Job("compress", 17, 24, 24, 12, 23)
    assert job.id == "compress:17-24:t12"
    assert Job.from_data(job.to_data()) == job
    assert Job("chunk", 2, 22, 22).id == "chunk:2-22:t0"
    assert Job("chunk", 2, 22, 22).id == Job.from_data(Job("chunk", 2, 22, 22).to_data()).id


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """User, assistant, and tool chains (a call, 1-3 results, then maybe an answer)."""
    messages: list[Message] = []
    for n in range(draw(st.integers(0, 60))):
        kind = draw(st.sampled_from(["user", "user", "assistant", "assistant", "tools"]))
        i = len(messages) + 1
        if kind == "user":
            messages.append(u(i))
        elif kind == "assistant":
            messages.append(a(i))
        else:
            ids = tuple(f"c{n}_{k}" for k in range(draw(st.integers(1, 3))))
            messages.append(a(i, ids, draw(st.sampled_from([None, "", "Let me check."]))))
            messages += [t(i + 1 + k, call) for k, call in enumerate(ids)]
    return messages


@settings(max_examples=150, deadline=None)
@given(conversations(), st.lists(st.integers(0, 100), max_size=8))
def test_same_jobs_whether_messages_come_one_at_a_time_or_in_batches(
    messages: list[Message], cuts: list[int]
) -> None:
    bounds = sorted({0, len(messages), *(c for c in cuts if c <= len(messages))})
    for composition in PRESETS.values():
        whole = in_one_batch(composition, messages)
        assert one_at_a_time(composition, messages) == whole
        batched: list[Job] = []
        for before, end in itertools.pairwise(bounds):
            batched += schedule(
                composition,
                messages[:end],
                count_before=before,
                turns_before=users(messages[:before]),
            )
        assert batched == whole
        # Every job reads messages that exist, and is due when its last one is there.
        for job in whole:
            assert 1 <= job.start <= job.end <= job.trigger <= len(messages)
        assert len({job.id for job in whole}) == len(whole)
        if composition.rolling is not None:
            turns = [job.turn for job in whole]
            assert turns == sorted(set(turns))
            for job in whole:
                assert messages[job.question - 1].role == "user"
                assert messages[job.end - 1].role == "assistant"
                assert not messages[job.end - 1].tool_calls
