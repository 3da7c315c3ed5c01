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
    them (see ``store/scripts/load.lua``): same generation, the process reads the
    messages after those it holds; the one before, it drops what the change replaced
    first; anything else, it reads the session again.

    ``ArchiveCache`` bounds what a process holds, in bytes, least recently used first.
"""

from __future__ import annotations

import datetime
import heapq
from array import array
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Generic, TypeVar

import numpy as np

from gateway.memory import terms as text_terms
from gateway.memory import vectors
from gateway.memory.block import Count, Item, recalled_line
from gateway.memory.model import Message
from gateway.memory.speakers import SpeakerIndex

K = TypeVar("K", bound=Hashable)

# What a message costs the process beyond its text: the Message, its postings and lengths;
# and its vector. And what a recalled message's line costs beyond its text (``line``).
_PER_MESSAGE_BYTES = 400
_VECTOR_BYTES = vectors.DIM + 4
_PER_LINE_BYTES = 300
# The ways an archive's lines are shown at once (this session's or another's, with dates
# or not, per counter): a few in use; past that many, all are made again.
_LINE_WAYS = 8

# Indexing one message is bounded in time and memory whatever its size. A
# long text is read in pieces of PIECE_CHARS, cut at a space: each is one short hold of
# the GIL, so a thread indexing a long message leaves the event loop its turns. At most
# MAX_STEMMED distinct words are stemmed (stemming is the costly step) and MAX_TERMS
# distinct terms kept, the most frequent (the first met among equals): an English text
# of a megabyte has about 10,000 distinct words, and 455,000 random ones would otherwise
# become as many postings.
PIECE_CHARS = 16 * 1024
MAX_TERMS = 4096
MAX_STEMMED = 4 * MAX_TERMS
_STEM_BATCH = 2048


@dataclass(frozen=True, slots=True)
class Indexed:
    """What recall keeps of one message's text (pure: made off the event loop for a long
    message, then added to an archive on it)."""

    terms: dict[str, int]  # term -> its frequency in the text
    length: int  # the text's terms, all of them (BM25's length)
    words: int  # its words, as ``str.split`` cuts them


def _most_frequent(counts: dict[str, int], n: int) -> dict[str, int]:
    """The ``n`` most frequent entries, in the order first met among equals."""
    return dict(heapq.nlargest(n, counts.items(), key=itemgetter(1)))


def _pieces(text: str) -> Iterator[str]:
    """The text in pieces of at most PIECE_CHARS, cut after a space or line break where
    there is one (terms never hold either, so none is cut in two)."""
    start, end = 0, len(text)
    while start < end:
        stop = start + PIECE_CHARS
        if stop < end:
            cut = max(text.rfind(" ", start, stop), text.rfind("\n", start, stop))
            stop = cut + 1 if cut > start else stop
        yield text[start:stop]
        start = stop


def index_text(text: str) -> Indexed:
    """The text's terms with their frequencies, bounded (see MAX_TERMS)."""
    if len(text) <= PIECE_CHARS:  # (nearly every message: the direct way)
        found = text_terms.stems(text_terms.words(text))
        counts: dict[str, int] = Counter(found)
        if len(counts) > MAX_TERMS:
            counts = _most_frequent(counts, MAX_TERMS)
        return Indexed(counts, len(found), len(text.split()))
    seen: Counter[str] = Counter()
    length = words = 0
    for piece in _pieces(text):
        found = text_terms.words(piece)
        length += len(found)
        words += len(piece.split())
        seen.update(found)
    chosen: dict[str, int] = seen
    if len(seen) > MAX_STEMMED:
        chosen = _most_frequent(seen, MAX_STEMMED)
    distinct = list(chosen)
    counts = Counter()
    for start in range(0, len(distinct), _STEM_BATCH):
        batch = distinct[start : start + _STEM_BATCH]
        for word, term in zip(batch, text_terms.stems(batch), strict=True):
            counts[term] += chosen[word]
    if len(counts) > MAX_TERMS:
        counts = _most_frequent(counts, MAX_TERMS)
    return Indexed(counts, length, words)


def index_messages(messages: Sequence[Message]) -> list[Indexed]:
    return [index_text(message.recall_text) for message in messages]


def text_size(messages: Sequence[Message]) -> int:
    """The characters indexing the messages reads (to tell when it leaves the loop)."""
    return sum(len(message.recall_text) for message in messages)


def _message_bytes(message: Message) -> int:
    """What holding a message costs: its text, its name (a client's, of any length), and
    what it costs beyond them."""
    name = message.name if isinstance(message.name, str) else ""
    return len(message.text) + len(name) + _PER_MESSAGE_BYTES + _VECTOR_BYTES


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
        # Who said each message, as the client named them (``Message.name``).
        self.speakers = SpeakerIndex()
        # term -> (positions in ``messages``, term frequency there), in position order.
        self.postings: dict[str, tuple[array[int], array[int]]] = {}
        # Per message: its vector's codes and their inverse length (zeros: no vector), in
        # arrays grown by doubling.
        self._codes = np.zeros((16, vectors.DIM), dtype=np.int8)
        self._inverse = np.zeros(16, dtype=np.float32)
        # Per way of showing them (``line``): the lines of the messages recalled so far,
        # by index, and the bytes they hold (in ``nbytes``).
        self._lines: dict[tuple[str | None, bool, Count], dict[int, Item]] = {}
        self._line_bytes = 0
        # What a fact's messages hold of its terms (``fact_keys``), by the fact's terms
        # and its messages' indexes: a function of those messages alone, made once while
        # they are held (at most ``_MOST_HELD`` entries, then made again).
        self.held_of_facts: dict[tuple[tuple[str, ...], int, int], tuple[int, ...]] = {}
        self.nbytes = 0

    @property
    def count(self) -> int:
        """The index of the newest message held (first - 1 when none is)."""
        return self.first + len(self.messages) - 1

    @property
    def codes(self) -> vectors.Codes:
        """One vector per message, as stored (a row of zeros: none)."""
        return self._codes[: len(self.messages)]

    @property
    def inverse_lengths(self) -> vectors.Floats:
        """Each row of ``codes``' inverse length (0: no vector)."""
        return self._inverse[: len(self.messages)]

    def message(self, index: int) -> Message | None:
        position = index - self.first
        return self.messages[position] if 0 <= position < len(self.messages) else None

    def tail(self, n: int) -> tuple[Message, ...]:
        return tuple(self.messages[-n:]) if n > 0 else ()

    def line(self, message: Message, session: str | None, dates: bool, count: Count) -> Item:
        """``message``, held here (or its counted copy), as the memory block shows it
        recalled (``block.recalled_line``), knowing what it counts: made once while it is
        held, not at every turn that recalls it again (a long session's turn sends a
        hundred lines or more, most of them sent before). Kept per way of showing it: by
        ``session``, ``dates`` and ``count`` (the key holds the counter, so no other can
        ever match it)."""
        lines = self._lines.get((session, dates, count))
        if lines is not None:
            item = lines.get(message.index)
            if item is not None:
                return item
        item = recalled_line(message, session, dates, count)
        if not self.first <= message.index <= self.count:
            return item  # (not one of those held: nothing to keep it with)
        if lines is None:
            if len(self._lines) >= _LINE_WAYS:
                self._forget_lines()
            lines = self._lines[(session, dates, count)] = {}
        lines[message.index] = item
        size = len(item.text) + _PER_LINE_BYTES
        self._line_bytes += size
        self.nbytes += size
        return item

    def _forget_lines(self) -> None:
        self._lines.clear()
        self.nbytes -= self._line_bytes
        self._line_bytes = 0

    def extend(
        self,
        messages: Sequence[Message],
        raw_vectors: Sequence[bytes | None],
        indexed: Sequence[Indexed] | None = None,
    ) -> None:
        """Append messages ``count + 1`` on, with their stored vectors (None: none) and
        their terms (``index_messages``; made here when not given)."""
        if not messages:
            return
        if indexed is None:
            indexed = index_messages(messages)
        start = len(self.messages)
        needed = start + len(messages)
        if needed > len(self._codes):
            size = max(needed, 2 * len(self._codes))
            codes, inverse = np.zeros((size, vectors.DIM), np.int8), np.zeros(size, np.float32)
            codes[:start], inverse[:start] = self._codes[:start], self._inverse[:start]
            self._codes, self._inverse = codes, inverse
        self._codes[start:needed], self._inverse[start:needed] = vectors.decode(raw_vectors)
        for position, (message, index) in enumerate(zip(messages, indexed, strict=True), start):
            for term, tf in index.terms.items():
                entry = self.postings.get(term)
                if entry is None:
                    entry = self.postings[term] = (array("I"), array("I"))
                entry[0].append(position)
                entry[1].append(tf)
            self.lengths.append(index.length)
            self.total_length += index.length
            self.days.append(day_of(message.ts))
            self.words.append(index.words)
            self.nbytes += self.speakers.add(message.role, message.name, position)
            self.messages.append(message)
            self.nbytes += _message_bytes(message)

    def truncate(self, count: int) -> None:
        """Forget the messages after index ``count`` (a regenerate replaced them)."""
        keep = max(0, count - self.first + 1)
        if keep >= len(self.messages):
            return
        self._forget_lines()  # (their messages' lines, under the indexes others take)
        self.held_of_facts.clear()
        dropped = self.messages[keep:]
        for message in dropped:
            self.nbytes -= _message_bytes(message)
        # Only the dropped messages' terms have postings to cut (at their ends); when they
        # hold more text than the archive holds terms, every term is looked at instead.
        touched: set[str] | list[str]
        if text_size(dropped) <= 4 * PIECE_CHARS:
            touched = set().union(*(index.terms for index in index_messages(dropped)))
        else:
            touched = list(self.postings)
        for term in touched:
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
        self.nbytes -= self.speakers.truncate(keep)
        del self.messages[keep:]
        self.total_length = sum(self.lengths[:keep])
        del self.lengths[keep:]
        del self.days[keep:]
        del self.words[keep:]
        self._codes[keep:] = 0
        self._inverse[keep:] = 0.0


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
