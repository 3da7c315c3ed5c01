"""Summarization jobs: when they are due (pure) and what they do to the tiers.

A job names a message range and the trigger that made it due. Its id is derived from
those, so enqueuing the same job twice is harmless, and running it twice is a no-op:
``run_job`` first checks whether the tiers already hold its effect. Together with the
version compare-and-set of the store, that makes at-least-once delivery safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from gateway.memory import durable
from gateway.memory.model import Fact, Message, RollingSummary, Summary, Tiers
from gateway.presets import Composition

if TYPE_CHECKING:
    from gateway.memory.summarizer import Summarizer

# "end" is not scheduled by the policy: the service enqueues it for a user's sessions that
# went idle, and the runner (not run_job) carries it out: see worker.JobRunner.end.
# "embed" is carried out by the runner too (vectors are not part of the tiers document).
JobKind = Literal["chunk", "recursive", "fold", "compress", "facts", "end", "embed"]


@dataclass(frozen=True, slots=True)
class Job:
    kind: JobKind
    start: int  # first message index the job reads
    end: int  # last message index the job reads
    trigger: int  # the message count that made it due
    turn: int = 0  # seed 002: the user turn folded or compressed
    question: int = 0  # seed 002: index of that turn's user message

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.start}-{self.end}:t{self.turn}"

    def to_data(self) -> dict[str, Any]:
        return {"kind": self.kind, "start": self.start, "end": self.end,
                "trigger": self.trigger, "turn": self.turn, "question": self.question}  # fmt: skip

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Job:
        return cls(data["kind"], int(data["start"]), int(data["end"]), int(data["trigger"]),
                   int(data.get("turn", 0)), int(data.get("question", 0)))  # fmt: skip


def _due(n: int, first_at: int, every: int) -> bool:
    return n >= first_at and (n - first_at) % every == 0


def schedule(
    composition: Composition,
    history: Sequence[Message],
    *,
    count_before: int,
    turns_before: int,
) -> list[Job]:
    """Jobs made due by the messages just appended (those in ``history`` past count_before).

    ``history`` holds the appended messages with their indexes, preceded by as much of the
    stored tail as was loaded (seed 002 needs the start of older turns).
    """
    appended = [m for m in history if m.index > count_before]
    if not appended:
        return []
    count_after = appended[-1].index
    jobs: list[Job] = []
    chunks = composition.chunks
    recursive = composition.recursive
    facts_every = composition.facts.extract_every if composition.facts else None
    for n in range(count_before + 1, count_after + 1):
        if facts_every is not None and n % facts_every == 0:
            jobs.append(Job("facts", n - facts_every + 1, n, n))
        if chunks is not None and _due(n, chunks.first_at, chunks.every):
            end = n - chunks.lag
            jobs.append(Job("chunk", max(1, end - chunks.size + 1), end, n))
        if recursive is not None and n == recursive.first_at:
            jobs.append(Job("recursive", 1, n - 1, n))
        elif recursive is not None and _due(n, recursive.first_at, recursive.every):
            end = n - recursive.lag
            jobs.append(Job("recursive", max(1, end - recursive.every + 1), end, n))
    if composition.rolling is not None:
        jobs += _rolling_jobs(composition, history, count_before, turns_before)
    if composition.recall is not None and composition.recall.embeddings is not None:
        jobs.append(Job("embed", count_before + 1, count_after, count_after))
    return jobs


def _rolling_jobs(
    composition: Composition, history: Sequence[Message], count_before: int, turns_before: int
) -> list[Job]:
    """Seed 002: one job per answered user turn; compression on turns > 6 with t % 4 == 0."""
    rolling = composition.rolling
    assert rolling is not None
    users_appended = sum(1 for m in history if m.index > count_before and m.role == "user")
    turn = turns_before + users_appended - sum(1 for m in history if m.role == "user")
    turn_starts: dict[int, int] = {}  # turn number -> index of its user message
    question = 0
    answered = True
    jobs: list[Job] = []
    for message in history:
        if message.role == "user":
            turn += 1
            turn_starts[turn] = message.index
            question, answered = message.index, False
        elif (
            message.role == "assistant"
            and message.text
            and not message.tool_calls  # "let me check" before a tool call is no answer
            and not answered
            and question
        ):
            answered = True  # also when stored before: a later answer is not this turn's
            if message.index <= count_before:
                continue
            compress = turn > rolling.compress_after_turn and turn % rolling.compress_every == 0
            if compress:
                first_turn = max(1, turn - rolling.compress_every + 1)
                if turn - rolling.compress_every <= rolling.compress_after_turn:
                    first_turn = 1  # the first compression takes everything so far
                start = 1 if first_turn == 1 else turn_starts.get(first_turn, history[0].index)
                jobs.append(Job("compress", start, message.index, message.index, turn, question))
            else:
                jobs.append(Job("fold", question, message.index, message.index, turn, question))
    return jobs


def needed_range(job: Job, tiers: Tiers) -> tuple[int, int]:
    """The messages ``run_job`` will read for this job, given the current tiers."""
    if job.kind == "recursive" and tiers.rolling is not None:
        # Catch up on anything a lost job left out, so no message is skipped.
        return min(job.start, tiers.rolling.end + 1), job.end
    return job.start, job.end


class _Work(NamedTuple):
    """What a job's handler works with (the arguments of ``run_job``)."""

    job: Job
    composition: Composition
    tiers: Tiers
    messages: Sequence[Message]
    summarizer: Summarizer
    now: float


async def run_job(
    job: Job,
    composition: Composition,
    tiers: Tiers,
    messages: Sequence[Message],
    summarizer: Summarizer,
    *,
    now: float,
) -> Tiers | None:
    """The tiers after this job, or None when the tiers already hold its effect, or the
    composition has no tier for it."""
    if not _has_tier_for(job, composition):
        # Queued under another composition: the preset changed while it waited, or
        # another gateway sharing the Redis runs another one. Nothing of it to keep.
        return None
    work = _Work(job, composition, tiers, messages, summarizer, now)
    handlers = {"chunk": _chunk, "recursive": _recursive, "facts": _facts}
    return await handlers.get(job.kind, _rolling)(work)


def _has_tier_for(job: Job, composition: Composition) -> bool:
    if job.kind == "chunk":
        return composition.chunks is not None
    if job.kind == "recursive":
        return composition.recursive is not None
    if job.kind in ("fold", "compress"):
        return composition.rolling is not None
    return True  # facts: extracted into the facts tier, or kept for a later one


async def _chunk(work: _Work) -> Tiers | None:
    job, composition, tiers, messages, summarizer, now = work
    chunks = composition.chunks
    assert chunks is not None
    if any(s.start == job.start and s.end == job.end for s in tiers.summaries):
        return None
    if any(s.start <= job.start and s.end >= job.end for s in tiers.summaries):
        return None  # already inside a merged summary
    summaries = sorted(tiers.summaries, key=lambda s: s.start)
    if chunks.keep is not None and len(summaries) >= chunks.keep and job.end < summaries[0].start:
        return None  # a late job for a chunk already dropped as the oldest
    written = await summarizer.chunk(messages)
    since, until = _span(messages)
    made = Summary(job.start, job.end, written.text, now, written.fallback, since, until)
    summaries = sorted([*summaries, made], key=lambda s: s.start)
    if chunks.keep is not None:
        summaries = summaries[-chunks.keep :]
    if chunks.merge_over is not None and len(summaries) > chunks.merge_over:
        merged = await summarizer.merge([s.text for s in summaries])
        first, last = summaries[0], summaries[-1]
        summaries = [
            Summary(
                first.start, last.end, merged.text, now, merged.fallback, first.since, last.until
            )
        ]
    facts = tiers.facts
    if chunks.extract_facts:
        facts = await _extracted(job, composition, facts, messages, summarizer)
    return replace(tiers, version=tiers.version + 1, summaries=tuple(summaries), facts=facts)


def _span(messages: Sequence[Message]) -> tuple[float, float]:
    """When the first and the last of the messages were said (0: unknown)."""
    times = [m.ts for m in messages if m.ts > 0]
    return (min(times), max(times)) if times else (0.0, 0.0)


async def _extracted(
    job: Job,
    composition: Composition,
    facts: tuple[Fact, ...],
    messages: Sequence[Message],
    summarizer: Summarizer,
) -> tuple[Fact, ...]:
    """Facts after adding what ``messages`` state: the model's, or model-free ones."""
    found, fallback = await summarizer.facts(messages)
    # The model's facts are sentences to key; when it failed, the keyed extractor reads
    # the user's own words. (Adding the fallback's unkeyed fact-like sentences as well was
    # measured to crowd the planted facts out: bench/recall.py, 100% → 99% present.)
    said = max((m.ts for m in messages), default=0.0)
    new = durable.extract(messages) if fallback else durable.keyed(found, job.start, job.end, said)
    keep = composition.facts.keep if composition.facts is not None else 100
    return durable.merge(facts, new, keep)


async def _facts(work: _Work) -> Tiers | None:
    job, composition, tiers, messages, summarizer, _ = work
    """Durable facts from the user's recent messages; a newer fact supersedes an older."""
    if tiers.facts_end >= job.end:
        return None
    users = [m for m in messages if m.role == "user"]
    facts = await _extracted(job, composition, tiers.facts, users, summarizer) if users else ()
    return replace(tiers, version=tiers.version + 1, facts=facts or tiers.facts, facts_end=job.end)


async def _recursive(work: _Work) -> Tiers | None:
    job, composition, tiers, messages, summarizer, now = work
    recursive = composition.recursive
    assert recursive is not None
    previous = tiers.rolling
    if previous is not None and previous.end >= job.end:
        return None
    start, end = needed_range(job, tiers)
    written = await summarizer.recursive(
        previous.text if previous else None,
        messages,
        start=start,
        end=end,
        limit_tokens=recursive.limit_tokens,
    )
    rolling = RollingSummary(
        text=written.text,
        start=previous.start if previous else start,
        end=end,
        version=(previous.version + 1) if previous else 1,
        ts=now,
        fallback=written.fallback,
    )
    return replace(tiers, version=tiers.version + 1, rolling=rolling)


async def _rolling(work: _Work) -> Tiers | None:
    job, composition, tiers, messages, summarizer, now = work
    rolling = composition.rolling
    assert rolling is not None
    previous = tiers.rolling
    if previous is not None and previous.turn >= job.turn:
        return None
    by_index = {m.index: m for m in messages}
    question = by_index[job.question].text if job.question in by_index else ""
    answer = by_index[job.end].text if job.end in by_index else ""
    if job.kind == "fold":
        written = await summarizer.fold(
            previous.text if previous else None, question, answer, max_words=rolling.fold_words
        )
    else:
        written = await summarizer.compress(
            previous.text if previous else None, messages, max_words=rolling.max_words
        )
    pair, _ = await summarizer.key_qa(question, answer)
    pairs = (*tiers.key_qa, replace(pair, turn=job.turn))
    if job.kind == "compress":
        pairs = pairs[-rolling.keep_pairs :]
    summary = RollingSummary(
        text=written.text,
        start=previous.start if previous else 1,
        end=max(job.end, previous.end if previous else 0),
        version=(previous.version + 1) if previous else 1,
        turn=job.turn,
        ts=now,
        fallback=written.fallback,
    )
    return replace(tiers, version=tiers.version + 1, rolling=summary, key_qa=pairs)
