"""Conversations as the job tests build them: numbered messages, and the jobs a preset
schedules for them, in one batch or one message at a time."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.memory.jobs import Job, schedule
from gateway.memory.model import Message
from gateway.presets import Composition


def u(n: int) -> Message:
    return Message(role="user", content=f"question {n}", index=n)


def a(n: int, calls: tuple[str, ...] = (), content: str | None = None) -> Message:
    tool_calls = tuple(
        {"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}} for c in calls
    )
    text = content if content is not None or calls else f"answer {n}"
    return Message(role="assistant", content=text, index=n, tool_calls=tool_calls or None)


def t(n: int, call: str) -> Message:
    return Message(role="tool", content=f"result {n}", index=n, tool_call_id=call)


def conv(n: int) -> list[Message]:
    """``n`` messages, user/assistant alternating from a user message, indexes 1..n."""
    return [u(i) if i % 2 else a(i) for i in range(1, n + 1)]


def users(messages: Sequence[Message]) -> int:
    return sum(1 for m in messages if m.role == "user")


def in_one_batch(composition: Composition, messages: Sequence[Message]) -> list[Job]:
    return schedule(composition, messages, count_before=0, turns_before=0)


def one_at_a_time(composition: Composition, messages: Sequence[Message]) -> list[Job]:
    jobs: list[Job] = []
    for i in range(len(messages)):
        jobs += schedule(
            composition, messages[: i + 1], count_before=i, turns_before=users(messages[:i])
        )
    return jobs


def ranges(jobs: Sequence[Job]) -> list[tuple[int, int, int]]:
    return [(job.start, job.end, job.trigger) for job in jobs]
