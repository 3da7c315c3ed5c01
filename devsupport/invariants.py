"""What must hold of a stored session whatever happened to it (pure checks over plain data).

Shared by the concurrency tests, the fault state machine and ``bench/faults.py``: each
returns a list of problems, empty when the log is sound, so a caller can assert on it or
count it.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def pairing_problems(log: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every user message is followed by its answer, and every answer follows its question.

    The fake upstream answers ``ack: <text>`` to a plain message, so an answer names the
    message it belongs to: a turn split by another turn shows up as a mismatch.
    """
    problems = []
    for position, message in enumerate(log):
        index = position + 1
        if message["role"] == "user":
            answer = log[position + 1] if position + 1 < len(log) else None
            if answer is None or answer["role"] != "assistant":
                problems.append(f"message {index} (user) is not followed by its answer")
            elif answer["content"] != f"ack: {message['content']}":
                problems.append(f"message {index + 1} answers another turn")
        elif message["role"] == "assistant":
            question = log[position - 1] if position else None
            if question is None or question["role"] != "user":
                problems.append(f"message {index} (assistant) does not follow a user message")
    return problems


def once_problems(log: Sequence[Mapping[str, Any]], acknowledged: Iterable[str]) -> list[str]:
    """Every acknowledged user text is stored exactly once; nothing is stored twice."""
    counts = Counter(m["content"] for m in log if m["role"] == "user")
    problems = [
        f"acknowledged turn {t!r} stored {counts[t]} times" for t in acknowledged if counts[t] != 1
    ]
    problems += [f"turn {t!r} stored {n} times" for t, n in counts.items() if n > 1]
    return sorted(set(problems))


def numbering_problems(log_length: int, state: Mapping[str, Any]) -> list[str]:
    """The memory API's count and window agree with the log, indexes 1..n without gaps."""
    problems = []
    if state["message_count"] != log_length:
        problems.append(f"message_count {state['message_count']} but {log_length} stored")
    indexes = [m["index"] for m in state["window"]]
    if indexes and indexes != list(range(indexes[0], indexes[0] + len(indexes))):
        problems.append(f"window indexes have gaps: {indexes}")
    if indexes and indexes[-1] != log_length:
        problems.append(f"window ends at {indexes[-1]}, log at {log_length}")
    return problems


def version_problems(versions: Sequence[int]) -> list[str]:
    """A summary version read over time never goes back."""
    return [f"version went back from {a} to {b}" for a, b in itertools.pairwise(versions) if b < a]
