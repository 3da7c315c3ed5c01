"""Facts as keys to the messages they were read from (pure, numpy).

A fact a summarizer model wrote ("Kevin plays football professionally", "Paola's
favourite dessert is tiramisu") names what a stretch of talk was about in words the talk
itself may not use: "What sports does Kevin play?" shares no word with "Had a match
today, we won 2-1", but its fact does. So a question that matches a model's fact lifts
the message the fact was read from, as if the fact's words were in that message's index
entry ("fact-augmented keys", LongMemEval: +9.4 points of recall).

A fact knows the range of messages its job read (``Fact.start`` .. ``Fact.end``), not
the one message; within the range each message is lifted in proportion to how many of
the fact's terms it holds (read from the archive's index), all of the range alike when
none holds any. A fact lifts by the share of the question it matches (by
idf), so that a fact sharing only the name the question asks about lifts little. Facts
read without a model (``Fact.fallback``: the user's own sentence, already in the index),
superseded ones, and those of more than ``MOST_SOURCES`` messages key nothing; nor do
facts whose messages are all in front of the model already.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.caching import memo_when_short
from gateway.memory.archive import Archive
from gateway.memory.model import Fact
from gateway.memory.recall import bm25_idf
from gateway.memory.terms import distinct_terms

# The best-matching facts that lift their messages: a long session's facts that share a
# word or two with the question lift a few stretches, not a hundred.
MOST_FACTS = 8
# A fact read from more messages than this (a long chunk's) says too little of which:
# it keys none.
MOST_SOURCES = 64


def fact_lifts(
    archive: Archive,
    facts: Sequence[Fact],
    query: Mapping[str, float],
    exclude: Collection[int] = (),
) -> npt.NDArray[np.float64] | None:
    """For each message of the archive, what the model's facts that match the query's
    terms lift it by: at most the share of the query the best of them matches (1: all of
    it, by idf); None when no fact matches. ``exclude``: the indexes already in front of
    the model (a fact all of whose messages are is passed over).

    A turn looks up the query's terms in the facts' index (``_facts_index``, made once
    per set of facts), so it costs what matches, not what the session holds; only the
    ``MOST_FACTS`` best look for their messages, in the archive's index (no text is read
    again). Scores add up in the query's order: the same in every process (a set's order
    is not), so that a turn recalls the same in every process."""
    n = len(archive.messages)
    if not n or not query or not facts:
        return None
    usable = [
        fact for fact in facts
        if not fact.fallback and not fact.superseded and fact.end - fact.start < MOST_SOURCES
    ]  # fmt: skip
    if not usable:
        return None  # (a session of model-free facts, the summarizer unreachable)
    index, owns = _facts_index(tuple(fact.text for fact in usable))
    matched: dict[int, float] = {}
    whole = 0.0
    for term, weight in query.items():
        # (By BM25's idf over the archive; a term no message holds counts the most.)
        entry = archive.postings.get(term)
        worth = weight * bm25_idf(n, len(entry[0]) if entry is not None else 0)
        whole += worth
        for number in index.get(term, ()):
            matched[number] = matched.get(number, 0.0) + worth
    if not matched or whole <= 0:
        return None
    held_from, held_to = archive.first, archive.count
    scored = []
    for number, score in matched.items():
        fact = usable[number]
        first, last = max(fact.start, held_from), min(fact.end, held_to)
        if first > last or all(i in exclude for i in range(first, last + 1)):
            continue  # read from messages no longer held, or all shown already
        scored.append((score / whole, number, first, last))
    if not scored:
        return None
    lifts = np.zeros(n, dtype=np.float64)
    for share, number, first, last in heapq.nlargest(MOST_FACTS, scored):
        window = lifts[first - held_from : last - held_from + 1]
        np.maximum(window, share * _held(archive, owns[number], first, last), out=window)
    return lifts


# Kept for the process: a pure function of a session's facts' texts (each at most 240
# characters; the key is their tuple, the value ~1 KB a fact), which every turn of the
# session reads again until a job or an edit changes them: at most 64 sets of facts.
@memo_when_short(limit=1024, maxsize=64)
def _facts_index(
    texts: tuple[str, ...],
) -> tuple[dict[str, tuple[int, ...]], tuple[tuple[str, ...], ...]]:
    """Each term's facts (by position), and each fact's terms in order."""
    owns = tuple(tuple(sorted(distinct_terms(text))) for text in texts)
    index: dict[str, list[int]] = {}
    for number, own in enumerate(owns):
        for term in own:
            index.setdefault(term, []).append(number)
    return {term: tuple(numbers) for term, numbers in index.items()}, owns


def _held(archive: Archive, own: tuple[str, ...], first: int, last: int) -> npt.NDArray[Any]:
    """Of messages ``first`` .. ``last``, how much of the fact each holds (how many of
    the fact's terms ``own``), the most 1; all 1 when none holds any.

    A function of those messages alone, so kept with the archive while it holds them
    (``Archive.held_of_facts``): a turn reads it, the first turn to need it makes it by
    a bisection of each term's postings (in plain Python: a range holds a few messages,
    and numpy's calls would cost more than the work)."""
    key = (own, first, last)
    counts = archive.held_of_facts.get(key)
    if counts is None:
        low, high = first - archive.first, last - archive.first
        found = [0] * (high - low + 1)
        postings = archive.postings
        for term in own:
            entry = postings.get(term)
            if entry is not None:
                positions = entry[0]  # in position order
                start = bisect_left(positions, low)
                for position in positions[start : bisect_right(positions, high, start)]:
                    found[position - low] += 1
        if len(archive.held_of_facts) >= _MOST_HELD:
            archive.held_of_facts.clear()
        counts = archive.held_of_facts[key] = tuple(found)
    top = max(counts)
    return np.array(counts, dtype=np.float64) / top if top else np.ones(len(counts))


# Ranges an archive keeps what they hold of, before it forgets them all: the lifting
# facts of a few turns (each entry is a few hundred bytes: at most ~75 KB an archive).
_MOST_HELD = 128
