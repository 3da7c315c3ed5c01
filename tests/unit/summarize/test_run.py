"""Running a summarization job: ``run_job`` with a fake summarizer whose texts name what it
was given, so the tiers show which messages each write read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from gateway.memory.jobs import Job, needed_range
from gateway.memory.model import KeyQA, Message, RollingSummary, Summary, Tiers
from gateway.presets import PRESETS, Composition, FactsTier
from gateway.summarize.run import run_job
from gateway.summarize.summarizer import Written
from tests.support.conversation import a, conv, in_one_batch, one_at_a_time, ranges, t, u

ROLLING_WINDOW = PRESETS["rolling-window"]
RECURSIVE = PRESETS["recursive-summary"]
ROLLING = PRESETS["rolling-summary"]
PROGRESSIVE = PRESETS["progressive"]
HYBRID = PRESETS["hybrid"]


# --- schedule: each preset as its seed writes it -------------------------------------------


CALL = ("c1",)


# --- run_job -------------------------------------------------------------------------------


class FakeSummarizer:
    """Writes texts that name what it read; records every call."""

    def __init__(self, facts: Callable[[Sequence[Message]], list[str]] | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._facts = facts or (lambda messages: [])

    async def chunk(self, messages: Sequence[Message]) -> Written:
        span = (messages[0].index, messages[-1].index)
        self.calls.append(("chunk", span))
        return Written(f"chunk {span[0]}-{span[1]}", False)

    async def recursive(
        self,
        previous: str | None,
        messages: Sequence[Message],
        *,
        start: int,
        end: int,
        limit_tokens: int = 7000,
    ) -> Written:
        self.calls.append(("recursive", (start, end), [m.index for m in messages], previous))
        return Written(f"{previous} + {start}-{end}" if previous else f"{start}-{end}", False)

    async def fold(
        self, summary: str | None, question: str, answer: str, *, max_words: int = 250
    ) -> Written:
        self.calls.append(("fold", question, answer, summary, max_words))
        return Written(f"fold({question})", False)

    async def compress(
        self, summary: str | None, messages: Sequence[Message], *, max_words: int = 300
    ) -> Written:
        span = (messages[0].index, messages[-1].index)
        self.calls.append(("compress", span, summary, max_words))
        return Written(f"compress {span[0]}-{span[1]}", False)

    async def key_qa(self, question: str, answer: str) -> tuple[KeyQA, bool]:
        self.calls.append(("key_qa", question, answer))
        return KeyQA(question, answer, ("tag",), turn=-1), False

    async def facts(
        self, messages: Sequence[Message], *, limit: int = 10
    ) -> tuple[list[str], bool]:
        self.calls.append(("facts", (messages[0].index, messages[-1].index)))
        return self._facts(messages), False

    async def merge(self, summaries: Sequence[str]) -> Written:
        self.calls.append(("merge", list(summaries)))
        return Written(" + ".join(summaries), True)

    def kinds(self) -> list[str]:
        return [call[0] for call in self.calls]


def run(
    job: Job,
    composition: Composition,
    tiers: Tiers,
    messages: Sequence[Message],
    fake: FakeSummarizer,
) -> Tiers | None:
    """One job as the worker runs it: it loads the messages ``needed_range`` names."""
    start, end = needed_range(job, tiers)
    loaded = [m for m in messages if start <= m.index <= end]
    return asyncio.run(run_job(job, composition, tiers, loaded, fake, now=float(job.trigger)))


def apply(
    composition: Composition,
    jobs: Sequence[Job],
    messages: Sequence[Message],
    fake: FakeSummarizer,
    tiers: Tiers | None = None,
) -> Tiers:
    """Run jobs in order; every write must raise the version by exactly one."""
    tiers = tiers or Tiers()
    for job in jobs:
        updated = run(job, composition, tiers, messages, fake)
        if updated is not None:
            assert updated.version == tiers.version + 1
            if updated.rolling is not None and tiers.rolling is not None:
                assert updated.rolling.version == tiers.rolling.version + 1
            tiers = updated
    return tiers


def spans(tiers: Tiers) -> list[tuple[int, int]]:
    return [(s.start, s.end) for s in tiers.summaries]


def test_rolling_window_85_messages_keeps_the_3_newest() -> None:
    # Seed 000's acceptance: 85 messages -> summaries 23-43, 44-64, 65-85.
    messages = conv(85)
    fake = FakeSummarizer()
    tiers = apply(ROLLING_WINDOW, in_one_batch(ROLLING_WINDOW, messages), messages, fake)
    assert spans(tiers) == [(23, 43), (44, 64), (65, 85)]
    assert [s.text for s in tiers.summaries] == ["chunk 23-43", "chunk 44-64", "chunk 65-85"]
    assert [s.ts for s in tiers.summaries] == [43.0, 64.0, 85.0]
    assert fake.calls == [
        ("chunk", (2, 22)),
        ("chunk", (23, 43)),
        ("chunk", (44, 64)),
        ("chunk", (65, 85)),
    ]
    assert tiers.version == 4
    assert tiers.facts == ()


def test_keep_drops_the_oldest_and_a_late_job_for_it_is_a_no_op() -> None:
    messages = conv(85)
    stored = Tiers(
        version=9, summaries=(Summary(23, 43, "B"), Summary(44, 64, "C"), Summary(65, 85, "D"))
    )
    fake = FakeSummarizer()
    assert run(Job("chunk", 2, 22, 22), ROLLING_WINDOW, stored, messages, fake) is None
    assert fake.calls == []


def test_a_late_job_that_still_belongs_is_put_in_order() -> None:
    messages = conv(85)
    stored = Tiers(version=2, summaries=(Summary(2, 22, "A"), Summary(44, 64, "C")))
    updated = run(Job("chunk", 23, 43, 43), ROLLING_WINDOW, stored, messages, FakeSummarizer())
    assert updated is not None
    assert spans(updated) == [(2, 22), (23, 43), (44, 64)]
    # With keep=3 full, a late middle chunk pushes out the oldest.
    stored = Tiers(
        version=3, summaries=(Summary(2, 22, "A"), Summary(44, 64, "C"), Summary(65, 85, "D"))
    )
    updated = run(Job("chunk", 23, 43, 43), ROLLING_WINDOW, stored, messages, FakeSummarizer())
    assert updated is not None and updated.version == 4
    assert spans(updated) == [(23, 43), (44, 64), (65, 85)]


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("n", [33, 120])
def test_every_job_is_idempotent(name: str, n: int) -> None:
    composition = PRESETS[name]
    messages = conv(n)
    jobs = in_one_batch(composition, messages)
    assert jobs
    tiers = apply(composition, jobs, messages, FakeSummarizer(lambda ms: [f"fact {ms[0].index}"]))
    fake = FakeSummarizer()
    for job in jobs:
        assert run(job, composition, tiers, messages, fake) is None, job
    assert fake.calls == []
    # At-least-once delivery: every job delivered twice gives the same tiers.
    twice = [job for job in jobs for _ in range(2)]
    again = apply(composition, twice, messages, FakeSummarizer(lambda ms: [f"fact {ms[0].index}"]))
    assert again == tiers


def test_progressive_merges_more_than_5_summaries_into_one() -> None:
    messages = conv(120)
    jobs = in_one_batch(PROGRESSIVE, messages)
    assert ranges(jobs)[:7] == [
        (1, 16, 20),
        (17, 32, 36),
        (33, 48, 52),
        (49, 64, 68),
        (65, 80, 84),
        (81, 96, 100),
        (97, 112, 116),
    ]
    fake = FakeSummarizer()
    five = apply(PROGRESSIVE, jobs[:5], messages, fake)
    assert len(five.summaries) == 5 and "merge" not in fake.kinds()
    six = apply(PROGRESSIVE, jobs[5:6], messages, fake, five)
    assert spans(six) == [(1, 96)]
    merged = six.summaries[0]
    assert merged.text == " + ".join(f"chunk {16 * i + 1}-{16 * i + 16}" for i in range(6))
    assert merged.fallback  # the merge's own fallback flag is kept
    assert [c for c in fake.calls if c[0] == "merge"] == [
        ("merge", [f"chunk {16 * i + 1}-{16 * i + 16}" for i in range(6)])
    ]
    # A job inside the merged range is done; the next chunk starts a new list.
    for job in jobs[:6]:
        assert run(job, PROGRESSIVE, six, messages, FakeSummarizer()) is None
    seven = apply(PROGRESSIVE, jobs[6:7], messages, fake, six)
    assert spans(seven) == [(1, 96), (97, 112)]
    assert seven.version == 7


def test_facts_are_deduplicated_and_capped() -> None:
    def found(messages: Sequence[Message]) -> list[str]:
        first = messages[0].index
        return [
            "User likes tea" if first == 1 else "user LIKES Tea",
            f"fact {first}",
            f"fact {first}",
        ]

    messages = conv(52)
    jobs = in_one_batch(PROGRESSIVE, messages)
    fake = FakeSummarizer(found)
    tiers = apply(PROGRESSIVE, jobs, messages, fake)
    assert [(f.text, f.start, f.end) for f in tiers.facts] == [
        ("User likes tea", 1, 16),
        ("fact 1", 1, 16),
        ("fact 17", 17, 32),
        ("fact 33", 33, 48),
    ]
    assert [c for c in fake.calls if c[0] == "facts"] == [
        ("facts", (1, 16)),
        ("facts", (17, 32)),
        ("facts", (33, 48)),
    ]
    capped = PROGRESSIVE.model_copy(update={"facts": FactsTier(keep=2)})
    tiers = apply(capped, jobs, messages, FakeSummarizer(lambda ms: [f"fact {ms[0].index}"]))
    assert [f.text for f in tiers.facts] == ["fact 17", "fact 33"]  # the newest kept


def test_no_facts_without_extract_facts() -> None:
    messages = conv(30)
    fake = FakeSummarizer(lambda ms: ["never"])
    tiers = apply(HYBRID, in_one_batch(HYBRID, messages), messages, fake)
    assert "facts" not in fake.kinds() and tiers.facts == ()
    assert spans(tiers) == [(1, 15), (16, 30)]


def test_recursive_summary_integrates_each_range_once() -> None:
    messages = conv(31)
    fake = FakeSummarizer()
    tiers = apply(RECURSIVE, in_one_batch(RECURSIVE, messages), messages, fake)
    assert fake.calls == [
        ("recursive", (1, 10), list(range(1, 11)), None),
        ("recursive", (2, 11), list(range(2, 12)), "1-10"),
        ("recursive", (12, 21), list(range(12, 22)), "1-10 + 2-11"),
    ]
    assert tiers.rolling == RollingSummary("1-10 + 2-11 + 12-21", 1, 21, version=3, ts=31.0)
    assert tiers.version == 3


def test_recursive_catches_up_when_a_job_was_lost() -> None:
    messages = conv(31)
    job11, _lost, job31 = in_one_batch(RECURSIVE, messages)
    fake = FakeSummarizer()
    first = apply(RECURSIVE, [job11], messages, fake)
    assert needed_range(job31, first) == (11, 21)  # 11 was never integrated
    tiers = apply(RECURSIVE, [job31], messages, fake, first)
    assert fake.calls[-1] == ("recursive", (11, 21), list(range(11, 22)), "1-10")
    assert tiers.rolling is not None
    assert (tiers.rolling.start, tiers.rolling.end, tiers.rolling.version) == (1, 21, 2)
    # The lost job turning up late changes nothing.
    assert run(_lost, RECURSIVE, tiers, messages, FakeSummarizer()) is None


def test_needed_range() -> None:
    job = Job("recursive", 12, 21, 31)
    assert needed_range(job, Tiers()) == (12, 21)
    assert needed_range(job, Tiers(rolling=RollingSummary("s", 1, 21))) == (12, 21)
    assert needed_range(job, Tiers(rolling=RollingSummary("s", 1, 5))) == (6, 21)
    chunk = Job("chunk", 23, 43, 43)
    assert needed_range(chunk, Tiers(rolling=RollingSummary("s", 1, 5))) == (23, 43)
    fold = Job("fold", 7, 8, 8, 4, 7)
    assert needed_range(fold, Tiers(rolling=RollingSummary("s", 1, 2, turn=1))) == (7, 8)


def test_rolling_summary_fold_and_compress() -> None:
    messages = conv(32)
    jobs = in_one_batch(ROLLING, messages)
    fake = FakeSummarizer()
    history: list[Tiers] = []
    tiers = Tiers()
    for job in jobs:
        tiers = apply(ROLLING, [job], messages, fake, tiers)
        history.append(tiers)
    # Turn 7: seven pairs (folds only append); turn 8 compresses and prunes to keep_pairs=6.
    assert [p.turn for p in history[6].key_qa] == [1, 2, 3, 4, 5, 6, 7]
    assert [p.turn for p in history[7].key_qa] == [3, 4, 5, 6, 7, 8]
    assert [p.turn for p in history[10].key_qa] == [3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert [p.turn for p in history[11].key_qa] == [7, 8, 9, 10, 11, 12]
    assert [p.turn for p in tiers.key_qa] == [11, 12, 13, 14, 15, 16]
    assert tiers.key_qa[-1] == KeyQA("question 31", "answer 32", ("tag",), 16)
    compressions = [c for c in fake.calls if c[0] == "compress"]
    assert [c[1] for c in compressions] == [(1, 16), (17, 24), (25, 32)]
    assert compressions[0][2] == "fold(question 13)" and compressions[0][3] == 300
    folds = [c for c in fake.calls if c[0] == "fold"]
    assert folds[0] == ("fold", "question 1", "answer 2", None, 250)
    assert folds[1][3] == "fold(question 1)"
    rolling = tiers.rolling
    assert rolling is not None
    assert (rolling.text, rolling.start, rolling.end, rolling.turn) == ("compress 25-32", 1, 32, 16)
    assert [h.rolling.version for h in history if h.rolling] == list(range(1, 17))
    assert [h.version for h in history] == list(range(1, 17))


def test_rolling_summary_late_or_repeated_turns_are_no_ops() -> None:
    messages = conv(12)
    jobs = in_one_batch(ROLLING, messages)
    tiers = apply(ROLLING, jobs[:4], messages, FakeSummarizer())
    fake = FakeSummarizer()
    for job in jobs[:4]:
        assert run(job, ROLLING, tiers, messages, fake) is None
    assert fake.calls == []
    # Turn 6 done before a late turn 5: turn 5 never goes back on it.
    skipped = apply(ROLLING, [jobs[5]], messages, FakeSummarizer(), tiers)
    assert run(jobs[4], ROLLING, skipped, messages, fake) is None


def test_fold_of_a_tool_turn_reads_question_and_final_answer() -> None:
    messages = [u(1), a(2, CALL, "Let me check."), t(3, "c1"), a(4, content="It is 21C.")]
    (job,) = in_one_batch(ROLLING, messages)
    fake = FakeSummarizer()
    tiers = apply(ROLLING, [job], messages, fake)
    assert fake.calls[0] == ("fold", "question 1", "It is 21C.", None, 250)
    assert tiers.key_qa == (KeyQA("question 1", "It is 21C.", ("tag",), 1),)


@pytest.mark.parametrize("name", list(PRESETS))
def test_versions_strictly_increase_over_a_long_conversation(name: str) -> None:
    composition = PRESETS[name]
    messages = conv(150)
    tiers = Tiers()
    versions = []
    for job in one_at_a_time(composition, messages):
        updated = run(job, composition, tiers, messages, FakeSummarizer())
        assert updated is not None  # in-order delivery: every job writes
        versions.append(updated.version)
        tiers = updated
    assert versions == list(range(1, len(versions) + 1))


@pytest.mark.parametrize(
    ("job", "preset"),
    [(Job("chunk", 1, 20, 20), "rolling-summary"), (Job("recursive", 1, 19, 20), "hybrid"),
     (Job("fold", 1, 2, 2, 1, 1), "hybrid"), (Job("compress", 1, 2, 2, 8, 1), "hybrid")],
)  # fmt: skip
def test_a_job_of_another_composition_changes_nothing(job: Job, preset: str) -> None:
    # Queued before the preset changed (or by a gateway running another one): a no-op,
    # not an error that would stop the worker.
    fake = FakeSummarizer()
    assert run(job, PRESETS[preset], Tiers(version=3), conv(40), fake) is None
    assert fake.calls == []
