"""Message vectors as stored, and the cosines recall computes from them (pure)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.memory import vectors

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, width=32)
vector = st.lists(finite, min_size=vectors.DIM, max_size=vectors.DIM).map(
    lambda values: np.array(values, dtype=np.float32)
)


def unit_rows(rows: np.ndarray) -> np.ndarray:
    """The stored rows as float unit vectors: what the codes stand for."""
    floats = rows.astype(np.float32)
    lengths = np.linalg.norm(floats, axis=1, keepdims=True)
    return np.divide(floats, lengths, out=np.zeros_like(floats), where=lengths > 0)


@given(st.lists(vector, min_size=1, max_size=12), vector)
@settings(max_examples=200, deadline=None)
def test_cosines_are_those_of_the_stored_directions(stored: list, asked: np.ndarray) -> None:
    rows, inverse = vectors.decode([vectors.encode(v) for v in stored])
    query = vectors.unit(asked)
    found = vectors.cosines(rows, inverse, query) if query is not None else None
    if query is None:
        return  # a question with no vector is never compared (recall's words only)
    expected = unit_rows(rows) @ query
    # The question is quantized as the messages are: a direction within ~1/127 per part.
    assert found is not None and found.dtype == np.float32 and found.shape == (len(stored),)
    assert np.allclose(found, expected, atol=0.02)


def test_vectors_keep_their_direction_in_bytes() -> None:
    vector = np.array([0.5, -2.0, 1.0] + [0.0] * (vectors.DIM - 3), dtype=np.float32)
    rows, _ = vectors.decode([vectors.encode(vector)])
    assert float(unit_rows(rows)[0] @ (vector / np.linalg.norm(vector))) > 0.9999


def test_a_message_without_a_vector_is_no_match() -> None:
    one = vectors.encode(np.ones(vectors.DIM, dtype=np.float32))
    rows, inverse = vectors.decode([one, None, b"short", b""])
    assert inverse[0] > 0 and not inverse[1:].any()
    assert not rows[1:].any()
    found = vectors.cosines(rows, inverse, vectors.unit(np.ones(vectors.DIM, np.float32)))
    assert found[0] > 0.99 and not found[1:].any()


def test_a_vector_of_zeros_is_stored_as_nothing() -> None:
    assert vectors.encode(np.zeros(vectors.DIM, dtype=np.float32)) == b""
    assert vectors.quantize(np.full(vectors.DIM, np.nan, dtype=np.float32)) is None
    rows, inverse = vectors.decode([])
    assert rows.shape == (0, vectors.DIM) and vectors.cosines(rows, inverse, np.ones(4)).size == 0
