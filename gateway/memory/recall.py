"""Lexical recall over a session's archive: BM25 on an incremental inverted index (pure).

Summaries lose exact facts (a seat number, an allergy, a date said at message 4); the
recall tier brings the original messages back, verbatim, when the new user message shares
rare words with them. No model is needed, and the index is kept in Redis as one hash per
session, ``term -> postings``, appended to by the same script that records a turn, so a
request reads only the postings of its own query terms, and of those only the newest
``redis_store.CANDIDATES_SCANNED`` bytes, rarest terms first: its cost is bounded,
whatever the length of the archive.

Postings are compact text, ``"<index>:<tf>:<length>,"`` per message, where ``length`` is
the message's number of indexed terms (BM25 needs it). Offsets are relative to the first
appended message (``"+<offset>:…"``) until the record script, which alone knows the final
indexes, makes them absolute. The stored value is ``"<df>|<postings>"``: the script keeps
the true document frequency, and only a common word's newest postings (see
``redis_store.POSTINGS_CAP``), so a request's reads stay flat as the archive grows.
"""

from __future__ import annotations

import heapq
import math
import re
import struct
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.memory.model import Message
from gateway.short_cache import remembered_when_short

_TOKEN = re.compile(r"[a-z0-9]+(?:['.-][a-z0-9]+)*")
# One posting entry, "<index>:<tf>:<length>," (absolute indexes, as the load returns them):
# its index and its "<tf>:<length>", which is all BM25 needs of it besides.
_ENTRY = re.compile(r"(\d+):(\d+:\d+),")
# Just the "<tf>:<length>" of each entry.
_PAIR = re.compile(r"\d+:(\d+:\d+),")
# Words too common to tell messages apart; numbers and names are what recall is for.
_STOPWORDS_TEXT = """a about above after again against all am an and any are as at be because been
    before being below between both but by can could did do does doing down during each
    few for from further had has have having he her here hers herself him himself his how
    i if in into is it its itself just me more most my myself no nor not now of off on
    once only or other our ours ourselves out over own same she should so some such than
    that the their theirs them themselves then there these they this those through to too
    under until up very was we were what when where which while who whom why will with
    would you your yours yourself yourselves also okay ok yes yeah please thanks thank
    hi hello hey sure really well like get got let lets let's i'm i've i'd i'll it's
    that's don't can't won't you're we're they're what's there's say said tell told
    know think want need make one two much many"""
_STOPWORDS = frozenset(_STOPWORDS_TEXT.split())
# BM25's usual constants: term-frequency saturation and length normalisation.
K1 = 1.2
B = 0.75


def _stem(token: str) -> str:
    """A light stemmer: plurals only, so "seats" finds "seat" but "14c" stays itself."""
    if len(token) > 4 and token.endswith("ies"):
        return token[:-3] + "y"
    if len(token) > 4 and token.endswith("sses"):
        return token[:-2]
    if len(token) > 3 and token.endswith("s") and not token.endswith("ss") and token.isalpha():
        return token[:-1]
    return token


# A turn's new user message is split into terms four times (its postings are read, it is
# ranked against them, its own postings and length are recorded): remembered, it is
# split once. Only short texts, so that the cache's size stays a few hundred KB.
@remembered_when_short(limit=4096, maxsize=512)
def terms(text: str) -> tuple[str, ...]:
    """The indexed terms of a text, in order (stopwords dropped, plurals folded)."""
    return tuple(_stem(t) for t in _TOKEN.findall(text.lower()) if t not in _STOPWORDS)


def index_entries(messages: Sequence[Message]) -> dict[str, str]:
    """Postings to append for newly recorded messages, offsets relative to the first."""
    entries: dict[str, list[str]] = {}
    for offset, message in enumerate(messages):
        found = terms(message.text)
        for term, tf in Counter(found).items():
            entries.setdefault(term, []).append(f"+{offset}:{tf}:{len(found)},")
    return {term: "".join(parts) for term, parts in entries.items()}


def indexed_length(messages: Iterable[Message]) -> int:
    return sum(len(terms(m.text)) for m in messages)


class EmbeddingsUnavailable(Exception):
    """The embeddings model failed or did not answer in time: recall stays lexical."""


class Embedder(Protocol):
    async def embed(self, texts: list[str]) -> list[list[float]]: ...


@dataclass(frozen=True, slots=True)
class Hit:
    index: int
    score: float


def _entries(raw: str) -> tuple[int, str]:
    """A stored value: its document frequency and its entries, still as text."""
    df, _, entries = raw.partition("|")
    return int(df), entries


def _entry_of(entries: str, index: str) -> str | None:
    """The "<tf>:<length>" of one message in a term's entries, found without parsing them
    all."""
    key = f"{index}:"
    if entries.startswith(key):
        at = 0
    else:
        at = entries.find("," + key) + 1
        if at == 0:
            return None
    return entries[at + len(key) : entries.index(",", at)]


# Messages still in the race looked up one by one (a substring search each) below this
# many; from it on, one pass over the term's entries is cheaper.
_LOOKUPS = 24


def rank(
    query: str,
    postings: Mapping[str, str | None],
    *,
    documents: int,
    total_length: int,
    exclude: frozenset[int] = frozenset(),
    limit: int = 4,
) -> list[Hit]:
    """The best BM25 matches for ``query``, best first, skipping ``exclude``d indexes.

    ``postings`` maps each query term to its postings as the load scanned them (None:
    never said): the true document frequency and the entries within the scan budget.

    Notes:
        Exact top-``limit`` BM25 with MaxScore pruning. A term adds less than
        ``idf * (K1 + 1)`` to any message's score. Terms are scored rarest first; once
        the terms left could not lift a message not yet seen to the current
        ``limit``-th score, only the messages still in the race are scored further,
        by looking them up rather than parsing every entry. Common words (small idf, up
        to 4 KiB of postings each) are exactly those terms, so a query's cost follows
        its rare words. Parsing every entry cost ~1 ms a request for ~1,000 entries.
        The last (commonest) term adds nothing after it, so a message it alone names
        scores its pair's factor times its weight: only the best pairs' newest messages
        are looked at (``_best_of_last_term``), which halves the rank of a question with
        one common word (70 -> 43 µs on a 10,000-message session).
    """
    if documents <= 0:
        return []
    average = max(total_length / documents, 1.0)
    lists = []
    for term in set(terms(query)):
        raw = postings.get(term)
        if raw:
            df, entries = _entries(raw)
            lists.append((math.log(1 + (documents - df + 0.5) / (df + 0.5)) * (K1 + 1), entries))
    lists.sort(key=lambda item: -item[0])
    # left[i]: more than terms i.. can add to one message's score.
    left = [0.0] * (len(lists) + 1)
    for i in range(len(lists) - 1, -1, -1):
        left[i] = left[i + 1] + lists[i][0]
    # A term said in more messages than are indexed (stale postings) has a negative idf:
    # it could lower the leaders' scores after the others were dropped. No pruning then.
    prune = bool(lists) and lists[-1][0] > 0
    race = False  # only the messages in ``scores`` can still make the top
    score = _Scorer(K1 * (1 - B), K1 * B / average)
    known = score.known
    # Indexes stay text until the end: an entry is matched, looked up and summed without
    # converting its three numbers (that was most of the time of a long session's rank).
    skipped = {str(index) for index in exclude}
    scores: dict[str, float] = {}
    last = len(lists) - 1
    for i, (weight, entries) in enumerate(lists):
        if prune and len(scores) >= limit:
            threshold = heapq.nlargest(limit, scores.values())[-1]
            if left[i] < threshold:
                race = True
                for index in [k for k, v in scores.items() if v + left[i] < threshold]:
                    del scores[index]
        if (race or (i == last and weight > 0)) and len(scores) < _LOOKUPS:
            for index in scores:
                found = _entry_of(entries, index)
                if found is not None:
                    scores[index] += weight * (known.get(found) or score(found))
            if not race:
                # The last term: a message it names that no rarer term did scores this
                # term's weight times its pair's factor, nothing more. So only the
                # messages of the best pairs are needed, newest first: a common word's
                # few hundred entries cost a pass in C and a few lookups, not a loop.
                scores |= _best_of_last_term(entries, weight, score, limit, scores, skipped)
            continue
        for index, pair in _ENTRY.findall(entries):
            if index in skipped or (race and index not in scores):
                continue
            # The factor looked up here, not in a call: this loop runs for every entry.
            scores[index] = scores.get(index, 0.0) + weight * (known.get(pair) or score(pair))
    if len(scores) > limit:
        # Only the messages that can make the top are converted and sorted (ties kept).
        cutoff = sorted(scores.values(), reverse=True)[limit - 1]
        scores = {k: v for k, v in scores.items() if v >= cutoff}
    best = sorted(((int(k), v) for k, v in scores.items()), key=lambda item: (-item[1], -item[0]))
    return [Hit(index, round(value, 4)) for index, value in best[:limit]]


def _best_of_last_term(
    entries: str,
    weight: float,
    score: _Scorer,
    limit: int,
    scored: Mapping[str, float],
    skipped: set[str],
) -> dict[str, float]:
    """The scores of the last term's messages not already ``scored`` that can make the
    top ``limit``: whole groups of equal "<tf>:<length>" pairs, best factor first, until
    ``limit`` are taken; in a group, the newest ``limit`` (entries are in index order, and
    of equal scores the newer message ranks first)."""
    factors = {pair: score.known.get(pair) or score(pair) for pair in set(_PAIR.findall(entries))}
    best: dict[str, float] = {}
    taken_last = None
    for pair in sorted(factors, key=factors.__getitem__, reverse=True):
        value = weight * factors[pair]
        if taken_last is not None and len(best) >= limit and value < taken_last:
            break
        needle = f":{pair},"
        group = 0
        end = len(entries)
        while group < limit:
            at = entries.rfind(needle, 0, end)
            if at < 0:
                break
            start = entries.rfind(",", 0, at) + 1
            index = entries[start:at]
            end = start
            if index in skipped or index in scored or index in best:
                continue
            best[index] = value
            group += 1
        taken_last = value
    return best


class _Scorer:
    """BM25's term-frequency factor, ``tf / (tf + K1 * (1 - B + B * length / average))``,
    remembered in ``known`` per "<tf>:<length>" as written in the postings: messages
    repeat the same few pairs, so most entries cost one dictionary lookup and no number
    parsing. Called for a pair not yet known (the factor is never 0: tf >= 1)."""

    def __init__(self, base: float, per_term: float) -> None:
        self.base = base
        self.per_term = per_term
        self.known: dict[str, float] = {}

    def __call__(self, pair: str) -> float:
        tf_text, _, length_text = pair.partition(":")
        tf = int(tf_text)
        found = self.known[pair] = tf / (tf + self.base + self.per_term * int(length_text))
        return found


def pack(vector: Sequence[float]) -> bytes:
    """A vector as Redis keeps it: little-endian float32."""
    return struct.pack(f"<{len(vector)}f", *vector)


def unpack(raw: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def rerank(
    hits: Sequence[Hit],
    query: Sequence[float],
    vectors: Mapping[int, Sequence[float]],
    *,
    weight: float,
    limit: int,
) -> list[Hit]:
    """BM25's candidates reordered by meaning: ``weight`` of the score is the cosine.

    Only candidates are compared (a plain Redis has no vector index, and scanning every
    stored vector would make recall's cost grow with the archive). A candidate without a
    vector (its embedding job has not run yet) keeps its lexical score alone.
    """
    if not hits:
        return []
    top = max(hit.score for hit in hits) or 1.0
    scored = []
    for hit in hits:
        lexical = hit.score / top
        vector = vectors.get(hit.index)
        semantic = cosine(query, vector) if vector is not None else lexical
        scored.append(Hit(hit.index, round((1 - weight) * lexical + weight * semantic, 4)))
    return sorted(scored, key=lambda h: (-h.score, -h.index))[:limit]
