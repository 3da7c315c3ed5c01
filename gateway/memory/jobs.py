"""Summarization jobs: what they are, and when they are due (pure).

A job names a message range and the trigger that made it due. Its id is derived from
those, so enqueuing the same job twice is harmless, and running it twice is a no-op:
``summarize.run.run_job`` first checks whether the tiers already hold its effect.
Together with the version compare-and-set of the store, that makes at-least-once
delivery safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.memory.model import Message, Tiers
from gateway.presets import Composition

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
    if composition.recall is not None and composition.recall.reranker is not None:
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
