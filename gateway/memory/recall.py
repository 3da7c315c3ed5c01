"""Recall: which archived messages best answer the new one (pure).

Every message of the archive is scored for the query by two signals, fused:

- *words*: BM25 over Snowball-stemmed terms (``terms``), so "cooked" finds "cooking"; a
  word of the question counts less the more stretches of the conversation it turns up
  in (``locality.spread_factors``: the other person's name in every greeting tells
  little about where the answer lies), and words that ask about the talk itself
  ("mention", "discuss") are not searched;
- *meaning*: the cosine between the message's and the question's static word-embedding
  vectors (``embedder``), so "what are her hobbies?" finds "I went skiing again".

A message's score spills onto its neighbours (``NEIGHBOUR``): the question a hit answered
and the answer it got rank just behind it, so they come along when they are worth their
tokens. A time the question names lifts the messages of its days (``times``): a date
written out ("on 29 Dec 2023"), the days on one side of it ("before 7 Jan 2024"), or a
time said relative to the conversation's present ("yesterday", "last week", "in May").
A question that names one of the speakers the client named (``Message.name``) lifts
that speaker's messages (``speakers``). Once the words of the best hits have searched
again (feedback), each hit lifts the messages around it, less the further they are
(``AROUND``): people talk about one thing for a while, and the evidence often lies a few
messages from the one that shares the question's words. Nothing is dropped by a
threshold: the caller takes hits best first until its token budget is used
(``assemble``).

The constants were chosen on the REALTALK conversations (``bench/recall.py --dataset
realtalk``), where each of them helped at both budgets measured, none lowering a category
of question by more than half a point; the scores are flat around them (±0.1 on each
moves the result by < 1 point). Evidence in context there, at 1,500 / 3,000 tokens:
64.6 / 75.5 % before the lift around hits, the spread of words, the talk words and the
relative times; 68.3 / 78.9 % with them. The lift does most (66.9 / 78.0 % alone), the
spread next (65.6 / 76.0 %); the talk words and the times add 0.1 to 0.3 points each
(REALTALK's questions name a time by its date, seldom by "yesterday" or "in January").

What did not help there: fusing the two signals by reciprocal rank (k 5 to 60) instead
of linearly (within 0.5 points); spreading the hits over days (at most so many a day, or
each further hit of a day worth less: 0.4 to 11 points lost: a question's evidence lies
together more often than apart); matching the words' own vectors one by one; adding the
best hits' vectors to the question's.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from gateway.memory import locality, speakers, times, vectors
from gateway.memory.archive import Archive
from gateway.memory.model import Message
from gateway.memory.terms import STOPWORDS, distinct_terms, stems, terms, words

# BM25's term-frequency saturation and length normalisation (flat on REALTALK from
# k1 0.9 to 2.0 and b 0.3 to 0.9).
K1 = 1.2
B = 0.75
# Share of the fused score that comes from meaning (0: words only).
SEMANTIC_WEIGHT = 0.6
# A message's words score, and its cosine, spill onto each neighbour at this rate.
NEIGHBOUR = 0.3
# What a named date adds to the messages of that day and the day after.
DATE_BOOST = 0.2
# A hit lifts the messages around it (``locality.around``): by this share of its score
# (the best hit anywhere counting 1), fading by AROUND_DECAY a message (half as much 23
# messages away). Flat on REALTALK from 0.15 to 0.2 and a decay of 0.95 to 0.98 (within
# 0.5 points); the best within a fixed window (10 or 25 messages), of the day, or of the
# session (up to a pause of hours) did 0.5 to 1 point less.
AROUND = 0.15
AROUND_DECAY = 0.97
# A new message with this few terms of its own that points back ("and her sister?",
# "what about that one?") is read with the turns before it: their terms count at most
# CONTEXT_WEIGHT each, and all of them together no more than the message's own.
FOLLOW_UP_TERMS = 2
CONTEXT_WEIGHT = 0.5
_POINTING_TEXT = """he she it they them her him his its their theirs that this those these there
    then and also too else other one ones"""
_POINTING = frozenset(_POINTING_TEXT.split())
# Words that ask about the talk itself, not about what was said ("when did she first
# mention the trip?", "what did we discuss?"): every message is talk, so they only find
# the few that happen to use them (stemmed, as ``terms`` makes them).
_ABOUT_TALK = frozenset({"mention", "discuss", "talk", "convers", "chat", "ask"})
# The second pass: the words of the first pass's best hits, at this weight of the words'
# share of the score.
FEEDBACK = 0.5
FEEDBACK_HITS = 5
FEEDBACK_TERMS = 10
# What the second pass reads of a long hit: its beginning (a pasted document's every
# word, read again at every request, would cost as much as indexing it).
FEEDBACK_CHARS = 16 * 1024
# A hit this short ("Yes, twice!") is no answer without the message it answers.
SHORT_WORDS = 4
# What a question that names one speaker (``speakers``) adds to each of that speaker's
# messages, on the fused score's scale. On REALTALK with its speakers' names sent, 0.2
# to 0.4 each gained 2 to 3 points at both budgets (0.3: every category up at both).
SPEAKER = 0.3
# What a model's fact that matches the whole question adds to the scores of the messages
# it was read from (``fact_keys``), on the fused score's scale (where a named date adds
# DATE_BOOST, and the best word match anywhere counts 1 - the semantic weight).
FACT_KEYS = 0.3

Vector = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Query:
    """What recall searches for: weighted terms, a unit vector, the spans of days named
    (``times.named_spans``), and the question, whose words may name a speaker
    (``speakers``: read only where the client named its speakers)."""

    terms: dict[str, float]
    vector: Vector | None = None
    spans: tuple[times.Span, ...] = ()
    question: str = ""

    @property
    def empty(self) -> bool:
        return not self.terms and self.vector is None


@dataclass(frozen=True, slots=True)
class Source:
    """One archive searched, the indexes already in front of the model (skipped), and
    what the model's facts that match the query lift each message by (``fact_keys``)."""

    archive: Archive
    exclude: frozenset[int] = frozenset()
    fact_lifts: npt.NDArray[np.float64] | None = field(default=None, compare=False)


@dataclass(slots=True)
class Hit:
    """Message ``index`` of ``sources[source]``, and its fused score (higher is better).
    (Not frozen: hundreds are made per request, and a frozen one costs several times
    more to make.)"""

    source: int
    index: int
    score: float


@dataclass(frozen=True, slots=True)
class Weights:
    semantic: float = SEMANTIC_WEIGHT
    neighbour: float = NEIGHBOUR
    date_boost: float = DATE_BOOST
    feedback: float = FEEDBACK
    k1: float = K1
    b: float = B
    around: float = AROUND
    around_decay: float = AROUND_DECAY
    # A model's fact that matches the question lifts its message (``fact_keys``).
    facts: float = FACT_KEYS
    # A question that names one speaker lifts their messages (``speakers``).
    speaker: float = SPEAKER
    # A question's word weighs less as it spreads over the conversation (``locality``).
    spread: bool = True


# --- The query ---------------------------------------------------------------------------


def build_query(
    new: str,
    context: Sequence[str] = (),
    *,
    known: Callable[[str], bool] = lambda _: True,
    embed: Callable[[str], Vector | None] | None = None,
    today: int = 0,
) -> Query:
    """The query of a new user message, and of the turns before it (``context``, oldest
    first) when it says too little on its own to be searched ("and what about her
    sister?").

    The vector is the meaning of the message's words that the archive holds (``known``,
    by stemmed term): a name the conversation never uses ("Kate's", for a user who is
    Kate) moves the vector away from what she said.
    """
    said = words(new)
    own = [(w, t) for w, t in zip(said, stems(said), strict=True) if t not in _ABOUT_TALK]
    weights: dict[str, float] = {}
    for _, term in own:
        weights[term] = 1.0
    follow_up = (
        len(weights) <= FOLLOW_UP_TERMS
        and any(context)
        and (not weights or any(w in _POINTING for w in _SAID.findall(new.lower())))
    )
    if follow_up:
        around = [t for t in dict.fromkeys(terms(" ".join(context))) if t not in weights]
        each = min(CONTEXT_WEIGHT, max(1, len(weights)) / max(1, len(around)))
        for term in around:
            weights[term] = each
    vector = None
    if embed is not None:
        meant = [w for w, t in own if known(t)]
        vector = embed(" ".join(meant) if meant else new)
        before = embed(" ".join(context)) if follow_up else None
        if before is not None:
            vector = vectors.unit(before * CONTEXT_WEIGHT + (0.0 if vector is None else vector))
    return Query(weights, vector, times.named_spans(new, today), new)


_SAID = re.compile(r"[a-z']+")

# --- Ranking -------------------------------------------------------------------------


def bm25_idf(documents: int, df: int) -> float:
    """BM25's idf of a term found in ``df`` of ``documents`` messages."""
    return math.log(1 + (documents - df + 0.5) / (df + 0.5))


def _spill(scores: npt.NDArray[Any], rate: float) -> npt.NDArray[Any]:
    """Each score plus ``rate`` times each neighbour's."""
    if rate == 0 or len(scores) < 2:
        return scores
    spilled = scores.copy()
    spilled[1:] += rate * scores[:-1]
    spilled[:-1] += rate * scores[1:]
    return spilled


def _words_score(
    archive: Archive, query: Query, weights: Weights, *, spread: bool = False
) -> npt.NDArray[np.float64]:
    """BM25 of every message of the archive; with ``spread``, each term's idf times its
    ``locality.spread_factors``."""
    n = len(archive.messages)
    if n == 0 or not query.terms:
        return np.zeros(n, dtype=np.float64)
    # Every term's postings at once: a few array operations per request, not per term
    # (each costs as much as a short posting list's arithmetic). A message's terms add up
    # in the query's order, as one addition per term would.
    found = [
        (weight, entry) for term, weight in query.terms.items()
        if (entry := archive.postings.get(term)) is not None
    ]  # fmt: skip
    if not found:
        return np.zeros(n, dtype=np.float64)
    # Each term's weight times its idf, for each of its postings.
    dfs = [len(entry[0]) for _, entry in found]
    idfs = np.array([
        weight * bm25_idf(n, df)
        for (weight, _), df in zip(found, dfs, strict=True)
    ])  # fmt: skip
    positions = np.concatenate([np.frombuffer(entry[0], dtype=np.uint32) for _, entry in found])
    if spread:
        idfs *= locality.spread_factors(positions, dfs, n)
    factor = np.repeat(idfs, dfs)
    tf = np.concatenate([np.frombuffer(entry[1], dtype=np.uint32) for _, entry in found])
    tf = tf.astype(np.float64)
    # BM25's length normalisation, k1 * (1 - b + b * length / mean length), computed
    # only where a term occurs (not over the whole archive, twice per request).
    lengths = np.frombuffer(archive.lengths, dtype=np.uint32)
    flat = weights.k1 * (1 - weights.b)
    per_term = weights.k1 * weights.b / max(archive.total_length / n, 1.0)
    norm = flat + per_term * lengths[positions]
    added = factor * tf * (weights.k1 + 1) / (tf + norm)
    return cast(npt.NDArray[np.float64], np.bincount(positions, weights=added, minlength=n))


def _meaning_score(archive: Archive, query: Query, weights: Weights) -> npt.NDArray[Any]:
    """Cosine of every message (0 for a message without a vector or pointing away)."""
    if query.vector is None or not archive.messages:
        return np.zeros(len(archive.messages), dtype=np.float64)
    # In float32, in place: at 10,000 messages each pass over the scores is a cache miss.
    cosine = vectors.cosines(archive.codes, archive.inverse_lengths, query.vector)
    np.maximum(cosine, 0.0, out=cosine)
    spilled = _spill(cosine, weights.neighbour)
    spilled *= 1 / (1 + 2 * weights.neighbour)
    return spilled


def rank(
    sources: Sequence[Source], query: Query, *, limit: int, weights: Weights = Weights()
) -> list[Hit]:
    """The best ``limit`` messages over every source, best first (ties: newer first).

    Word scores are comparable across sources only once scaled by one maximum (BM25
    depends on each archive's statistics): the best word match anywhere counts 1.

    Notes:
        Two passes. The second searches again with the words that the first pass's best
        hits have in common and the question lacks (pseudo-relevance feedback): "Which
        city am I travelling to next month?" finds "I'm visiting my sister next month",
        and through "sister" the earlier "my sister lives in Lyon" that holds the
        answer, which shares no word with the question. Then each message is lifted by
        the best score around it (``_lift``).
    """
    if query.empty or limit <= 0:
        return []
    semantic = weights.semantic if query.vector is not None else 0.0
    fused = _fused(sources, query, weights, semantic)
    if weights.feedback:
        expansion = Query(_feedback_terms(sources, fused, query))
        # (Not by spread: the feedback's words are those of the best hits' stretches.)
        more = _lexical(sources, expansion, weights, spread=False)
        for scores, extra in zip(fused, more, strict=True):
            scores += weights.feedback * (1 - semantic) * extra
            scores[scores < 0] = 0.0  # (exclusions stay excluded)
    if weights.around:
        _lift(fused, weights)
    if len(sources) == 1:  # (the usual case: already in order)
        return _best(0, sources[0].archive.first, fused[0], limit)
    hits: list[Hit] = []
    for number, (source, scores) in enumerate(zip(sources, fused, strict=True)):
        hits += _best(number, source.archive.first, scores, limit)
    hits.sort(key=lambda h: (-h.score, -h.index))
    return hits[:limit]


def _lift(fused: Sequence[npt.NDArray[np.float64]], weights: Weights) -> None:
    """Each score plus ``weights.around`` times the best score around it (``locality``),
    the best anywhere counting 1. An excluded message (score 0 or less) lifts nothing and
    stays excluded."""
    lifts = [locality.around(np.maximum(scores, 0.0), weights.around_decay) for scores in fused]
    top = max((float(lift.max()) for lift in lifts if len(lift)), default=0.0)
    if top <= 0:
        return
    for scores, lift in zip(fused, lifts, strict=True):
        lift *= weights.around / top
        np.add(scores, lift, out=scores, where=scores > 0)


def _lexical(
    sources: Sequence[Source], query: Query, weights: Weights, *, spread: bool
) -> list[npt.NDArray[np.float64]]:
    """Each source's spilled word scores, scaled so that the best anywhere is 1."""
    found = [
        _spill(_words_score(s.archive, query, weights, spread=spread), weights.neighbour)
        for s in sources
    ]
    top = max((float(scores.max()) for scores in found if len(scores)), default=0.0) or 1.0
    return [scores / top for scores in found]


def _fused(
    sources: Sequence[Source], query: Query, weights: Weights, semantic: float
) -> list[npt.NDArray[np.float64]]:
    """Each source's first-pass scores: words and meaning fused, a named date's boost,
    and -1 where a message is excluded."""
    fused = []
    lexical = _lexical(sources, query, weights, spread=weights.spread)
    speaker = _named_speaker(sources, query) if weights.speaker else None
    for source, words_score in zip(sources, lexical, strict=True):
        archive = source.archive
        scores = (1 - semantic) * words_score
        if semantic and archive.messages:
            scores += semantic * _meaning_score(archive, query, weights)
        if query.spans and weights.date_boost and archive.messages:
            days = np.frombuffer(archive.days, dtype=np.int32)
            near = np.zeros(len(days), dtype=bool)
            for first, last in query.spans:
                near |= (days >= first) & (days <= last)
            scores += weights.date_boost * near
        if source.fact_lifts is not None and weights.facts:
            scores += weights.facts * source.fact_lifts
        if speaker is not None:
            for positions in archive.speakers.of(speaker):
                scores[np.frombuffer(positions, dtype=np.uint32)] += weights.speaker
        for index in source.exclude:
            position = index - archive.first
            if 0 <= position < len(scores):
                scores[position] = -1.0
        fused.append(scores)
    return fused


def _named_speaker(sources: Sequence[Source], query: Query) -> str | None:
    """The one speaker of any source that the question names (``speakers``); None when
    it names none, or several. The question's words are read only when a source has
    names: most sessions have none, and a question may be 16 KB."""
    held = [source.archive.speakers for source in sources if source.archive.speakers.has_names]
    if not held or not query.question:
        return None
    asked = speakers.parts(query.question)
    named: set[str] = set()
    for index in held:
        named |= index.named(asked)
        if len(named) > 1:
            return None
    return named.pop() if named else None


def _feedback_terms(
    sources: Sequence[Source], fused: Sequence[npt.NDArray[np.float64]], query: Query
) -> dict[str, float]:
    """The terms of the first pass's best ``FEEDBACK_HITS`` messages that the query does
    not have, the most telling ``FEEDBACK_TERMS`` (by the summed idf of where they occur)."""
    best = heapq.nlargest(
        FEEDBACK_HITS,
        ((float(scores[p]), n, int(p)) for n, scores in enumerate(fused)
         for p in _top(scores, FEEDBACK_HITS) if scores[p] > 0),
    )  # fmt: skip
    weight: dict[str, float] = {}
    for score, number, position in best:
        archive = sources[number].archive
        documents = len(archive.messages)
        for term in distinct_terms(archive.messages[position].recall_text[:FEEDBACK_CHARS]):
            if term in query.terms:
                continue
            df = len(archive.postings[term][0]) if term in archive.postings else 1
            idf = bm25_idf(documents, df)
            weight[term] = weight.get(term, 0.0) + score * idf
    # Of equal weights, the term last in alphabetical order, not the first met: a hit's
    # terms are a set, whose order changes from process to process, and a turn recalls
    # the same in every process (the same context, which a prompt cache can reuse).
    chosen = heapq.nlargest(FEEDBACK_TERMS, weight.items(), key=lambda item: (item[1], item[0]))
    return {term: 1.0 for term, _ in chosen}


def _best(source: int, first: int, scores: npt.NDArray[np.float64], limit: int) -> list[Hit]:
    """The ``limit`` best positive scores of one archive, as hits, best first; of equal
    scores, the newer message first."""
    positions = np.flatnonzero(scores > 0)
    if len(positions) > limit:
        positions = positions[_top(scores[positions], limit)]
    positions = positions[np.lexsort((-positions, -scores[positions]))]
    values = np.round(scores[positions], 6).tolist()
    return [Hit(source, first + p, v) for p, v in zip(positions.tolist(), values, strict=True)]


def _top(scores: npt.NDArray[np.float64], k: int) -> npt.NDArray[np.intp]:
    """The positions of the ``k`` best scores, in no order (of equal scores, the newer).

    Notes:
        A selection over every score (``argpartition``) is the costliest step of ranking
        a 10,000-message archive. The smallest of ``k`` block maxima is a floor that at
        least ``k`` scores reach; usually only a few times ``k`` do, and only those are
        selected from. The blocks are strided (every ``k``-th score), not runs of
        neighbours, whose scores rise and fall together.
    """
    n = len(scores)
    if n <= k:
        return np.arange(n)
    floor = scores[: n // k * k].reshape(-1, k).max(axis=0).min()
    candidates = np.flatnonzero(scores >= floor)  # in position order
    if len(candidates) == k:
        return candidates
    values = scores[candidates]
    kth = np.partition(values, len(values) - k)[len(values) - k]
    above = candidates[values > kth]
    tied = candidates[values == kth]
    return np.concatenate((above, tied[len(tied) - (k - len(above)) :]))


def lead_in(archive: Archive, index: int) -> Message | None:
    """The message a short hit answers (``SHORT_WORDS`` words or fewer): "Twice!" means
    nothing without "How often have you been to Turks and Caicos?"."""
    found = with_lead_in(archive, index)
    return found[1] if found is not None else None


def with_lead_in(archive: Archive, index: int) -> tuple[Message, Message | None] | None:
    """Message ``index`` of the archive and its ``lead_in``, in one look (a turn resolves
    a hundred hits and more); None when the archive does not hold it."""
    position = index - archive.first
    messages = archive.messages
    if not 0 <= position < len(messages):
        return None
    if position and archive.words[position] <= SHORT_WORDS:
        return messages[position], messages[position - 1]
    return messages[position], None


def vocabulary(archives: Iterable[Archive]) -> Callable[[str], bool]:
    """Whether any of the archives holds a term (for ``build_query``'s ``known``)."""
    held = [a.postings for a in archives]
    return lambda term: term not in STOPWORDS and any(term in postings for postings in held)
