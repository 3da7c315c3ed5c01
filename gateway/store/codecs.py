"""Typed arguments and replies of the request path's scripts (``scripts/*.lua``).

Each script's KEYS and ARGV are built in one ``encode`` and its reply read in one
``decode``, beside the dataclasses the store's callers see; the positions they rely on
are documented at the top of each ``.lua`` file. Pure: no IO. A reply's stored messages
are parsed by the ``parse`` a decode is given: the store's ``ParsedMessages``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.memory.jobs import Job
from gateway.memory.model import Message, Pin
from gateway.store.keys import SessionKeys
from gateway.store.parsed_messages import ParseMessage

Keys = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Known:
    """What a process holds of a session's log: its first ``count`` messages, under
    ``generation`` (see ``memory.archive``)."""

    generation: str
    count: int


@dataclass(frozen=True, slots=True)
class LogSlice:
    """Messages of a log from position ``start`` (0-based) to its end, with their stored
    vectors (None where there is none). ``warm``: ``start`` is where what the caller
    holds ends, under ``generation`` (it drops anything it holds past ``start``)."""

    generation: str
    count: int  # messages in the log
    start: int
    warm: bool
    messages: tuple[Message, ...]
    vectors: tuple[bytes | None, ...]


@dataclass(frozen=True, slots=True)
class Predicted:
    """Writes that depend on where an append lands (job ranges, pinned message indexes),
    computed before the call for the log the plan expects, so they go in the same round
    trip. The record script makes them only if the append lands there: ``first`` is the
    index its first message gets, ``turns`` the user messages stored before it."""

    first: int
    turns: int
    jobs: Sequence[Job] = ()
    pins: Sequence[Pin] = ()


@dataclass(frozen=True, slots=True)
class Recorded:
    first: int  # index of the first appended message; -1: the log had another length
    count: int  # messages in the session now
    turns: int  # user messages in the session now
    new_user: bool  # the session's user id was set or changed by this append
    predicted: bool = False  # the append landed where predicted: its writes were made
    idle: tuple[str, ...] = ()  # with ``Joining.idle_before``: the user's idle sessions
    generation: str = ""  # the log's generation after the append (see memory.archive)
    repeated: bool = False  # this record id had run already: nothing appended this time

    @classmethod
    def decode(cls, reply: Sequence[Any]) -> Recorded:
        """record.lua's reply (``idle`` is not the script's: the store adds it)."""
        first, count, turns, new_user, predicted, generation, repeated = reply
        return cls(
            int(first),
            int(count),
            int(turns),
            bool(new_user),
            bool(predicted),
            (),
            bytes(generation or b"").decode(),
            bool(repeated),
        )


@dataclass(frozen=True, slots=True)
class RecordArgs:
    """record.lua's call. ``messages`` are stored forms (``Message.to_json``);
    ``vectors`` one per message ("" for none) or none at all; ``appended`` the bytes the
    tenant's quota counts for the turn; ``generation`` the log's new generation token
    should the script need one."""

    keys: SessionKeys
    messages: Sequence[bytes]
    user_messages: int
    now: float
    ttl_s: int
    generation: str
    appended: int
    user_id: str | None = None  # None: keep the session's
    truncate_to: int | None = None
    expected_count: int | None = None
    vectors: Sequence[bytes] = ()
    predicted: Predicted | None = None
    record_id: str = ""

    def __post_init__(self) -> None:
        if self.vectors and len(self.vectors) != len(self.messages):
            raise ValueError("one vector per message, or none")

    def encode(self) -> tuple[Keys, list[Any]]:
        predicted = self.predicted
        jobs = predicted.jobs if predicted else ()
        pins = predicted.pins if predicted else ()
        argv: list[Any] = [
            self.ttl_s,
            repr(self.now),
            self.keys.session_id,
            self.user_id or "",
            -1 if self.truncate_to is None else self.truncate_to,
            -1 if self.expected_count is None else self.expected_count,
            self.user_messages,
            len(self.messages),
            predicted.first if predicted else -1,
            predicted.turns if predicted else -1,
            len(jobs),
            len(pins),
            self.generation,
            self.appended,
            self.record_id,
            *self.messages,
            *(self.vectors or [b""] * len(self.messages)),
            *(item for job in jobs for item in (job.id, json.dumps(job.to_data()))),
            *(item for pin in pins for item in (pin.id, json.dumps(pin.to_data()))),
        ]
        # branches last: the script finds it as KEYS[#KEYS] (see SessionKeys.all).
        return self.keys.all(), argv


def fields(flat: Sequence[bytes]) -> dict[bytes, bytes]:
    """A hash as a script returns HGETALL (a flat list of names and values), as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def aligned_slice(
    messages: Sequence[bytes],
    offset: int,
    vectors: Sequence[bytes],
    start: int,
    parse: ParseMessage,
) -> tuple[tuple[Message, ...], tuple[bytes | None, ...]]:
    """A script's slice of the log (``slice.lua``): the messages from position ``start``,
    and their vectors aligned with them."""
    parsed = tuple(parse(raw, start + 1 + i) for i, raw in enumerate(messages))
    aligned: list[bytes | None] = [None] * max(0, -offset)
    aligned += [bytes(v) if v else None for v in vectors]
    aligned += [None] * (len(parsed) - len(aligned))
    return parsed, tuple(aligned[: len(parsed)])


@dataclass(frozen=True, slots=True)
class LoadArgs:
    """load.lua's call: the newest ``tail`` messages, or those after what the caller
    holds (``known``, up to ``most`` of them), with their vectors if asked."""

    keys: SessionKeys
    tail: int
    known: Known | None = None
    vectors: bool = False
    most: int = 0

    def encode(self) -> tuple[Keys, list[Any]]:
        keys = self.keys
        names = (keys.meta, keys.log, keys.tiers, keys.pins, keys.jobs, keys.vec)
        generation, held = (self.known.generation, self.known.count) if self.known else ("", 0)
        return names, [self.tail, generation, held, self.most, 1 if self.vectors else 0]


@dataclass(frozen=True, slots=True)
class LoadReply:
    """load.lua's reply: the session's meta hash, its log's slice, and (with a tail) its
    raw tiers document, pins and pending-job count."""

    fields: dict[bytes, bytes]
    log: LogSlice
    tiers: bytes | None
    pins: Sequence[bytes]
    pending: int

    @classmethod
    def decode(cls, reply: Sequence[Any], parse: ParseMessage) -> LoadReply:
        meta, count, start, warm, raw, offset, raw_vectors, tiers, pins, pending = reply
        found = fields(meta)
        messages, vectors = aligned_slice(raw, int(offset), raw_vectors, int(start), parse)
        generation = found.get(b"gen", b"").decode()
        log = LogSlice(generation, int(count), int(start), bool(warm), messages, vectors)
        return cls(found, log, tiers, pins, int(pending))


@dataclass(frozen=True, slots=True)
class ArchivePage:
    """archive_page.lua's call: messages at positions ``start``..``stop`` (0-based,
    inclusive)."""

    keys: SessionKeys
    start: int
    stop: int
    vectors: bool

    def encode(self) -> tuple[Keys, list[Any]]:
        keys = self.keys
        return (keys.meta, keys.log, keys.vec), [self.start, self.stop, 1 if self.vectors else 0]

    def decode(
        self, reply: Sequence[Any], parse: ParseMessage
    ) -> tuple[str, int, tuple[Message, ...], tuple[bytes | None, ...]]:
        """The log's generation and length as read with the page, its messages and their
        vectors."""
        generation, count, raw, offset, raw_vectors = reply
        messages, vectors = aligned_slice(raw, int(offset), raw_vectors, self.start, parse)
        return bytes(generation).decode(), int(count), messages, vectors
