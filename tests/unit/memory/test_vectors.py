"""Message vectors as stored, and the cosines recall computes from them (pure)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.memory import vectors


def unit_rows(rows: np.ndarray) -> np.ndarray:
    """The stored rows as float unit vectors: what the codes stand for."""
    floats = rows.astype(np.float32)
    lengths = np.linalg.norm(floats, axis=1, keepdims=True)
    return np.divide(floats, lengths, out=np.zeros_like(floats), where=lengths > 0)


def random_vector(rng: np.random.Generator) -> np.ndarray:
    """A vector of DIM float32 parts of one magnitude (1e-15 to 1e3: squared, still a normal
    float32), some parts zero. Subnormal vectors have a test of their own below."""
    scale = 10.0 ** rng.uniform(-15, 3)
    values = rng.standard_normal(vectors.DIM) * scale
    values[rng.random(vectors.DIM) < rng.uniform(0, 0.9)] = 0.0
    return values.astype(np.float32)


@given(st.integers(min_value=0, max_value=2**32 - 1), st.integers(min_value=1, max_value=12))
@settings(max_examples=200, deadline=None)
def test_cosines_are_those_of_the_stored_directions(seed: int, count: int) -> None:
    # The vectors are built by numpy from a drawn seed: drawing 128 floats one by one took
    # hypothesis 24 s for the same 200 examples.
    rng = np.random.default_rng(seed)
    stored = [random_vector(rng) for _ in range(count)]
    asked = random_vector(rng)
    rows, inverse = vectors.decode([vectors.encode(v) for v in stored])
    query = vectors.unit(asked)
    found = vectors.cosines(rows, inverse, query) if query is not None else None
    if query is None:
        return  # a question with no vector is never compared (recall's words only)
    expected = unit_rows(rows) @ query
    # The question is quantized as the messages are: a direction within ~1/127 per part.
    assert found is not None and found.dtype == np.float32 and found.shape == (len(stored),)
    assert np.allclose(found, expected, atol=0.02)


def test_a_vector_of_subnormal_parts_keeps_its_direction() -> None:
    smallest = np.nextafter(np.float32(0), np.float32(1))
    tiny = np.zeros(vectors.DIM, dtype=np.float32)
    tiny[:2] = [smallest, -3 * smallest]
    rows, _ = vectors.decode([vectors.encode(tiny)])
    assert rows[0][:3].tolist() == [42, -127, 0]


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
