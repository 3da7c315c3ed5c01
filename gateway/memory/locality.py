"""Where in a conversation things lie, for recall (pure, numpy).

People talk about one thing for a while, then move on. Two consequences recall uses:

- a message near a strong hit is likelier to matter than one far from any (``around``):
  the evidence a question needs is often a few messages away from the message that
  shares its words ("What sports does Kevin play?" matches "do you like the sport?";
  "I just finished playing volleyball" comes two messages later, with no word of the
  question);
- a word that turns up in every stretch of the conversation (the other person's name in
  each greeting, "today", "work") tells less about where the answer lies than one of a
  few stretches' talk, however rare it is message by message (``spread_factors``).

Both go by position in the conversation, not by time: they need no timestamps, and a
pause of a day or a minute between two messages changes nothing.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from gateway.caching import memo

# A stretch of the conversation, for a word's spread: this many messages (flat on REALTALK
# from 10 to 80: within 0.6 points at both budgets measured).
STRETCH = 20


def around(scores: npt.NDArray[np.float64], decay: float) -> npt.NDArray[np.float64]:
    """For each position, the best of ``scores[j] * decay ** |i - j|`` over every j (the
    scores non-negative, ``0 < decay < 1``): a strong hit's score, fading with the
    distance from it.

    Notes:
        A running maximum each way, over the scores scaled by ``decay ** -j`` (then
        ``decay ** i`` again): a few passes over the array, no logarithm, with the powers
        made once per decay (``_powers``). So that those stay finite, a long archive is
        gone through in blocks, each taking the best of the one before it.
    """
    n = len(scores)
    found = np.empty(n, dtype=np.float64)
    if n == 0:
        return found
    up, down = _powers(decay)  # decay ** -k and decay ** k, k = 0 .. block
    block = len(up) - 1
    carry = 0.0
    for start in range(0, n, block):  # forward: the best at or before each position
        part = scores[start : start + block]
        size = len(part)
        ahead = np.maximum.accumulate(part * up[:size])
        ahead *= down[:size]
        np.maximum(ahead, carry * down[1 : size + 1], out=ahead)
        found[start : start + size] = ahead
        carry = float(ahead[-1])
    carry = 0.0
    for stop in range(n, 0, -block):  # backward: the best at or after, and the better
        part = scores[max(0, stop - block) : stop]
        size = len(part)
        behind = np.maximum.accumulate((part * down[:size])[::-1])[::-1]
        behind *= up[:size]
        np.maximum(behind, carry * down[size:0:-1], out=behind)
        view = found[stop - size : stop]
        np.maximum(view, behind, out=view)
        carry = float(behind[0])
    return found


# ``decay ** -k`` stays below this: float64 holds up to about e ** 709.
_MOST_EXPONENT = 600.0
_MOST_BLOCK = 1 << 16


@memo(maxsize=8)
def _powers(decay: float) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``decay ** -k`` and ``decay ** k`` for k = 0 .. one block (the most that keeps the
    first finite, at most ``_MOST_BLOCK``): made once per decay, not at every request."""
    block = max(1, min(_MOST_BLOCK, int(_MOST_EXPONENT / -math.log(decay))))
    k = np.arange(block + 1, dtype=np.float64)
    return np.power(decay, -k), np.power(decay, k)


def spread_factors(
    positions: npt.NDArray[np.uint32], counts: list[int], n: int
) -> npt.NDArray[np.float64]:
    """For each of several terms, how much its spread over the conversation leaves of its
    weight: 1 for a term of one stretch (``STRETCH`` messages), less the more stretches it
    turns up in, as an idf over stretches (BM25's, over a term in one stretch).

    ``positions`` are the terms' postings one after the other, each term's in position
    order, ``counts`` how many each has; ``n`` is the archive's number of messages.
    """
    if not counts:
        return np.zeros(0, dtype=np.float64)
    stretches = positions // STRETCH
    # A posting opens a new stretch of its term where the stretch changes or a term begins.
    opens = np.empty(len(stretches), dtype=bool)
    opens[0] = True
    opens[1:] = stretches[1:] != stretches[:-1]
    starts = np.cumsum([0, *counts[:-1]])
    opens[starts] = True
    found = np.add.reduceat(opens, starts).astype(np.float64)
    total = max(1, -(-n // STRETCH))
    idf = np.log1p((total - found + 0.5) / (found + 0.5))
    return idf / math.log1p((total - 0.5) / 1.5)
