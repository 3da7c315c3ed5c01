"""Running a summarization job: the model's work on a message range, folded into the tiers.

``run_job`` is the async half of a job (``memory.jobs`` says when one is due): it asks the
summarizer for the job's text, through the ``SummaryWriter`` it is given (``Summarizer``
is one), and returns the tiers with that text in place. Running a job twice is a no-op:
it first checks whether the tiers already hold its effect.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple, Protocol

from gateway import offload
from gateway.memory import durable
from gateway.memory.jobs import Job, needed_range
from gateway.memory.model import Fact, KeyQA, Message, RollingSummary, Summary, Tiers
from gateway.presets import Composition
from gateway.summarize.summarizer import Written, chars_of


class SummaryWriter(Protocol):
    """What a job asks of the summarizer: the texts it writes (``Summarizer``'s methods)."""

    async def chunk(self, messages: Sequence[Message]) -> Written: ...

    async def recursive(
        self,
        previous: str | None,
        messages: Sequence[Message],
        *,
        start: int,
        end: int,
        limit_tokens: int = 7000,
    ) -> Written: ...

    async def fold(
        self, summary: str | None, question: str, answer: str, *, max_words: int = 250
    ) -> Written: ...

    async def compress(
        self, summary: str | None, messages: Sequence[Message], *, max_words: int = 300
    ) -> Written: ...

    async def key_qa(self, question: str, answer: str) -> tuple[KeyQA, bool]: ...

    async def facts(
        self, messages: Sequence[Message], *, limit: int = 10
    ) -> tuple[list[str], bool]: ...

    async def merge(self, summaries: Sequence[str]) -> Written: ...


class _Work(NamedTuple):
    """What a job's handler works with (the arguments of ``run_job``)."""

    job: Job
    composition: Composition
    tiers: Tiers
    messages: Sequence[Message]
    summarizer: SummaryWriter
    now: float


async def run_job(
    job: Job,
    composition: Composition,
    tiers: Tiers,
    messages: Sequence[Message],
    summarizer: SummaryWriter,
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
    summarizer: SummaryWriter,
) -> tuple[Fact, ...]:
    """Facts after adding what ``messages`` state: the model's, or model-free ones."""
    found, fallback = await summarizer.facts(messages)
    keep = composition.facts.keep if composition.facts is not None else 100
    # Off the event loop when the messages are long (``offload.sized``): the in-process
    # worker shares it with the requests.
    work = (job, facts, messages, found, fallback, keep)
    return await offload.sized(chars_of(messages), _merged_facts, *work)


def _merged_facts(
    job: Job,
    facts: tuple[Fact, ...],
    messages: Sequence[Message],
    found: list[str],
    fallback: bool,
    keep: int,
) -> tuple[Fact, ...]:
    # The model's facts are sentences to key; when it failed, the keyed extractor reads
    # the user's own words. (Adding the fallback's unkeyed fact-like sentences as well was
    # measured to crowd the planted facts out: bench/recall.py, 100% → 99% present.)
    said = max((m.ts for m in messages), default=0.0)
    new = durable.extract(messages) if fallback else durable.keyed(found, job.start, job.end, said)
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
