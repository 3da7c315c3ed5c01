"""Where in a conversation things lie: a hit's surroundings, a word's spread."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.memory.locality import STRETCH, around, spread_factors


def around_by_hand(scores: list[float], decay: float) -> list[float]:
    return [max(s * decay ** abs(i - j) for j, s in enumerate(scores)) for i in range(len(scores))]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.just(0.0), st.floats(0.0, 2.0)), max_size=60),
    st.floats(0.5, 0.999),
)
def test_around_is_the_best_score_fading_with_distance(scores: list[float], decay: float) -> None:
    found = around(np.array(scores, dtype=np.float64), decay)
    assert found.tolist() == pytest.approx(around_by_hand(scores, decay), rel=1e-9, abs=1e-300)


def test_a_long_archive_is_lifted_across_the_blocks_it_is_gone_through_in() -> None:
    """At a decay of 0.5 the powers stay finite for 865 messages: 2,500 take three
    blocks, and a hit near the end of one lifts the start of the next."""
    rng = np.random.default_rng(7)
    scores = rng.random(2_500) * (rng.random(2_500) < 0.05)
    scores[864] = 3.0  # the last of the first block forward …
    scores[1_635] = 3.0  # … and the first of the last block backward
    distance = np.abs(np.arange(2_500)[:, None] - np.arange(2_500)[None, :])
    expected = (scores[None, :] * 0.5**distance).max(axis=1)
    assert around(scores, 0.5) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_a_strong_hit_lifts_its_surroundings_less_the_further_they_are() -> None:
    scores = np.zeros(9)
    scores[4] = 1.0
    found = around(scores, 0.5)
    assert found.tolist() == pytest.approx([0.0625, 0.125, 0.25, 0.5, 1, 0.5, 0.25, 0.125, 0.0625])
    assert around(np.zeros(3), 0.9).tolist() == [0.0, 0.0, 0.0]  # nothing lifts nothing
    assert len(around(np.zeros(0), 0.9)) == 0


def spread_by_hand(postings: list[list[int]], n: int) -> list[float]:
    total = max(1, math.ceil(n / STRETCH))
    out = []
    for positions in postings:
        found = len({p // STRETCH for p in positions})
        idf = math.log(1 + (total - found + 0.5) / (found + 0.5))
        out.append(idf / math.log(1 + (total - 0.5) / 1.5))
    return out


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 400).flatmap(
    lambda n: st.tuples(
        st.just(n),
        st.lists(st.sets(st.integers(0, n - 1), min_size=1).map(sorted), min_size=1, max_size=6),
    )
))  # fmt: skip
def test_a_terms_spread_is_counted_in_stretches(case: tuple[int, list[list[int]]]) -> None:
    n, postings = case
    positions = np.array([p for term in postings for p in term], dtype=np.uint32)
    found = spread_factors(positions, [len(term) for term in postings], n)
    assert found.tolist() == pytest.approx(spread_by_hand(postings, n))


def test_a_word_of_one_stretch_keeps_its_weight_and_one_of_every_stretch_loses_most() -> None:
    n = 10 * STRETCH
    one = [3, 5, 9]  # three times, in the first stretch
    every = [s * STRETCH for s in range(10)]  # once in each
    positions = np.array(one + every, dtype=np.uint32)
    kept, spread = spread_factors(positions, [len(one), len(every)], n).tolist()
    assert kept == pytest.approx(1.0)
    assert spread < 0.1
