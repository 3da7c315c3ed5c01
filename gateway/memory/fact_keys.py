"""Facts as keys to the messages they were read from (pure, numpy).

A fact a summarizer model wrote ("Kevin plays football professionally", "Paola's
favourite dessert is tiramisu") names what a stretch of talk was about in words the talk
itself may not use: "What sports does Kevin play?" shares no word with "Had a match
today, we won 2-1", but its fact does. So a question that matches a model's fact lifts
the message the fact was read from, as if the fact's words were in that message's index
entry ("fact-augmented keys", LongMemEval: +9.4 points of recall).

A fact knows the range of messages its job read (``Fact.start`` .. ``Fact.end``), not
the one message; within the range the lift goes to the messages that share the most of
the fact's words (by their idf), all of the range alike when none shares any. Facts read
without a model (``Fact.fallback``: the user's own sentence, already in the index) and
superseded facts key nothing.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from gateway.caching import memo_when_short
from gateway.memory.archive import Archive
from gateway.memory.model import Fact
from gateway.memory.terms import distinct_terms

# What the best-matching fact adds to its message's score, on the scale of the words'
# (the best word match anywhere counts 1).
FACT_KEYS = 0.3
# The best-matching facts that lift their messages, those that match at least half as
# well as the best: a name the question shares with every fact of a long session lifts
# a few messages, not a hundred.
MOST_FACTS = 8
LEAST_OF_BEST = 0.5
# A fact read from more messages than this (a long chunk's) says too little of which:
# it keys none.
MOST_SOURCES = 64


def fact_lifts(
    archive: Archive, facts: Sequence[Fact], query: Mapping[str, float]
) -> npt.NDArray[np.float64] | None:
    """For each message of the archive, what the model's facts that match the query's
    terms lift it by (the best such fact counting 1); None when no fact matches.

    Every current fact is matched (a set intersection each); only the best ones look for
    their messages (``MOST_FACTS``, ``LEAST_OF_BEST``)."""
    n = len(archive.messages)
    if not n or not query or not facts:
        return None
    asked = frozenset(query)
    idf = _idf(archive)
    weight = {term: query[term] * idf(term) for term in asked}
    scored = []
    owns = _terms_of(tuple(fact.text for fact in facts))
    for number, (fact, own) in enumerate(zip(facts, owns, strict=True)):
        if fact.fallback or fact.superseded:
            continue
        shared = own & asked
        if shared:
            scored.append((sum(map(weight.__getitem__, shared)), number, fact, own))
    best = heapq.nlargest(MOST_FACTS, scored)
    lifts: npt.NDArray[np.float64] | None = None
    for score, _, fact, own in best:
        if score <= 0 or score < LEAST_OF_BEST * best[0][0]:
            break
        first, last = max(fact.start, archive.first), min(fact.end, archive.count)
        if first > last or fact.end - fact.start >= MOST_SOURCES:
            continue  # read from messages the archive no longer holds, or too many
        if lifts is None:
            lifts = np.zeros(n, dtype=np.float64)
        window = lifts[first - archive.first : last - archive.first + 1]
        shares = _sources(archive, own, first, last, idf)
        np.maximum(window, score * shares, out=window)
    if lifts is None:
        return None
    lifts /= lifts.max()
    return lifts


def _sources(
    archive: Archive, own: frozenset[str], first: int, last: int, idf: Callable[[str], float]
) -> npt.NDArray[np.float64]:
    """Of messages ``first`` .. ``last``, how much of the fact each holds (by the idf of
    the fact's terms it has), the most 1; all 1 when none holds any."""
    messages = archive.messages[first - archive.first : last - archive.first + 1]
    held = np.array(
        [sum(map(idf, own & distinct_terms(m.recall_text))) for m in messages], dtype=np.float64
    )
    top = held.max()
    return held / top if top > 0 else np.ones_like(held)


def _idf(archive: Archive) -> Callable[[str], float]:
    """BM25's idf of a term over the archive's messages (a term none holds: the most),
    each term's worked out once a turn."""
    n = len(archive.messages)
    known: dict[str, float] = {}

    def idf(term: str) -> float:
        found = known.get(term)
        if found is None:
            entry = archive.postings.get(term)
            df = len(entry[0]) if entry is not None else 0
            found = known[term] = math.log(1 + (n - df + 0.5) / (df + 0.5))
        return found

    return idf


# Kept for the process: a pure function of a session's facts' texts (each at most 240
# characters), which every turn of the session reads again (as long as no job or edit
# changed them), so that a turn looks each up once, not each fact's.
@memo_when_short(limit=1024, maxsize=256)
def _terms_of(texts: tuple[str, ...]) -> tuple[frozenset[str], ...]:
    return tuple(map(distinct_terms, texts))
