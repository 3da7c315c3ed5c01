"""Recall for one request: the present that relative times are read from."""

from __future__ import annotations

import datetime

from gateway.memory.archive import Archive
from gateway.memory.model import Message
from gateway.memory.reconcile import Reconciled
from gateway.service.recalling import _today


def at(text: str) -> float:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC).timestamp()


def day(text: str) -> int:
    return datetime.date.fromisoformat(text).toordinal()


def archive_until(*times: str) -> Archive:
    archive = Archive("g")
    messages = [Message("user", "hello", index=i + 1, ts=at(t)) for i, t in enumerate(times)]
    archive.extend(messages, [None] * len(messages))
    return archive


def plan(new: Message) -> Reconciled:
    return Reconciled(prompt=(), prior=(), to_record=(new,), new=(new,))


def test_the_present_is_the_conversations_not_the_clocks() -> None:
    imported = archive_until("2023-03-01T10:00", "2023-03-05T22:00")
    asked = plan(Message("user", "what did I eat yesterday?"))  # no time of its own
    assert _today(asked, [imported]) == day("2023-03-05")
    # Another session of the user's, newer, when this one is young.
    other = archive_until("2023-04-02T08:00")
    assert _today(asked, [imported, other]) == day("2023-04-02")
    assert _today(asked, [Archive("empty")]) == 0  # nothing to read a present from


def test_a_question_that_says_when_it_was_sent_is_its_own_present() -> None:
    imported = archive_until("2023-03-01T10:00")
    dated = plan(Message("user", "and yesterday?", ts=at("2023-03-09T09:00")))
    assert _today(dated, [imported]) == day("2023-03-09")
