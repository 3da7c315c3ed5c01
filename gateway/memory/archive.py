"""A session's archive as recall searches it, held in the gateway's memory (pure data).

Redis keeps the log (the truth); a process keeps, per session it serves, every message
parsed once with what recall scores it by: its stemmed terms (BM25 postings), its vector
and its day. A request then reads from Redis only what was appended since (usually the
previous turn's two messages) and ranks the whole archive in memory: recall's cost no
longer depends on a prefetch guessing the hits, and a hit's neighbours are at hand.

Notes:
    The log only grows, except when a regenerate (or an edit) replaces its last messages.
    Every such change gives the session a new *generation* (a random token in its meta
    hash, new again when the session is erased and started over), and a process trusts
    what it holds only under the generation it read it with. The load script compares
    them (see ``store.redis_store.LOAD_SCRIPT``): same generation, the process reads the
    messages after those it holds; the one before, it drops what the change replaced
    first; anything else, it reads the session again.

    ``ArchiveCache`` bounds what a process holds, in bytes, least recently used first.
"""

from __future__ import annotations

import datetime
from array import array
from collections import Counter, OrderedDict
from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

import numpy as np

from gateway.memory import terms as text_terms
from gateway.memory import vectors
from gateway.memory.model import Message

K = TypeVar("K", bound=Hashable)

# What a message costs the process beyond its text: the Message, its postings and lengths.
_PER_MESSAGE_BYTES = 400


def day_of(ts: float) -> int:
    """A timestamp's day (UTC) as a proleptic ordinal; 0 for an unknown time."""
    if ts <= 0:
        return 0
    try:
        return datetime.datetime.fromtimestamp(ts, datetime.UTC).toordinal()
    except (OverflowError, OSError, ValueError):
        return 0


class Archive:
    """Messages ``first`` .. ``count`` of one session, with their terms and vectors."""

    def __init__(self, generation: str, first: int = 1) -> None:
        self.generation = generation
        self.first = first  # the index of messages[0]
        self.messages: list[Message] = []
        # Per message: its number of terms (BM25's length), its day, its number of words.
        self.lengths = array("I")
        self.days = array("i")
        self.words = array("I")
        self.total_length = 0
        # term -> (positions in ``messages``, term frequency there), in position order.
        self.postings: dict[str, tuple[array[int], array[int]]] = {}
        self._vectors = np.zeros((16, vectors.DIM), dtype=np.float32)
        self.nbytes = 0

    @property
    def count(self) -> int:
        """The index of the newest message held (first - 1 when none is)."""
        return self.first + len(self.messages) - 1

    @property
    def vectors(self) -> vectors.Matrix:
        """One unit vector per message (a row of zeros: none)."""
        return self._vectors[: len(self.messages)]

    def message(self, index: int) -> Message | None:
        position = index - self.first
        return self.messages[position] if 0 <= position < len(self.messages) else None

    def tail(self, n: int) -> tuple[Message, ...]:
        return tuple(self.messages[-n:]) if n > 0 else ()

    def extend(self, messages: Sequence[Message], raw_vectors: Sequence[bytes | None]) -> None:
        """Append messages ``count + 1`` on, with their stored vectors (None: none)."""
        if not messages:
            return
        start = len(self.messages)
        needed = start + len(messages)
        if needed > len(self._vectors):
            grown = np.zeros((max(needed, 2 * len(self._vectors)), vectors.DIM), np.float32)
            grown[:start] = self._vectors[:start]
            self._vectors = grown
        self._vectors[start:needed] = vectors.decode(raw_vectors)
        for position, message in enumerate(messages, start):
            found = text_terms.stems(text_terms.words(message.text))
            for term, tf in Counter(found).items():
                entry = self.postings.get(term)
                if entry is None:
                    entry = self.postings[term] = (array("I"), array("I"))
                entry[0].append(position)
                entry[1].append(tf)
            self.lengths.append(len(found))
            self.total_length += len(found)
            self.days.append(day_of(message.ts))
            self.words.append(len(message.text.split()))
            self.messages.append(message)
            self.nbytes += len(message.text) + _PER_MESSAGE_BYTES + 4 * vectors.DIM

    def truncate(self, count: int) -> None:
        """Forget the messages after index ``count`` (a regenerate replaced them)."""
        keep = max(0, count - self.first + 1)
        if keep >= len(self.messages):
            return
        dropped = self.messages[keep:]
        for message in dropped:
            self.nbytes -= len(message.text) + _PER_MESSAGE_BYTES + 4 * vectors.DIM
        # Only the dropped messages' terms have postings to cut (at their ends).
        for term in set(text_terms.stems(text_terms.words(" ".join(m.text for m in dropped)))):
            entry = self.postings.get(term)
            if entry is None:
                continue
            positions, tfs = entry
            cut = len(positions)
            while cut > 0 and positions[cut - 1] >= keep:
                cut -= 1
            if cut == 0:
                del self.postings[term]
            else:
                del positions[cut:]
                del tfs[cut:]
        del self.messages[keep:]
        self.total_length = sum(self.lengths[:keep])
        del self.lengths[keep:]
        del self.days[keep:]
        del self.words[keep:]
        self._vectors[keep:] = 0.0


class ArchiveCache(Generic[K]):
    """The archives a process holds, at most ``max_bytes`` of them, least recently used
    first out. A hint, never the truth: whoever reads one checks its generation first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[K, Archive] = OrderedDict()
        self._sizes: dict[K, int] = {}  # each archive's bytes when last counted
        self.nbytes = 0

    def get(self, key: K) -> Archive | None:
        archive = self._items.get(key)
        if archive is not None:
            self._items.move_to_end(key)
        return archive

    def put(self, key: K, archive: Archive) -> None:
        self.discard(key)
        self._items[key] = archive
        self._sizes[key] = 0
        self.resized(key)

    def resized(self, key: K) -> None:
        """Count again what ``key``'s archive holds (it grew or shrank in place), and
        evict the least recently used archives until everything fits."""
        archive = self._items.get(key)
        if archive is None:
            return
        self.nbytes += archive.nbytes - self._sizes[key]
        self._sizes[key] = archive.nbytes
        while self.nbytes > self.max_bytes and self._items:
            oldest = next(iter(self._items))
            self.discard(oldest)  # at worst ``key`` itself: larger than the whole budget

    def discard(self, key: K) -> None:
        if self._items.pop(key, None) is not None:
            self.nbytes -= self._sizes.pop(key)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: K) -> bool:
        return key in self._items
