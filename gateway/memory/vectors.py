"""Message vectors as Redis keeps them, and as recall compares them (pure).

A vector is stored as ``DIM`` signed bytes, scaled so that its largest component is
±127: recall compares directions only (cosine), so the scale is not kept. 128 bytes a
message instead of 512 as float32; on the REALTALK conversations the evidence recall puts
in context is the same to a tenth of a point either way.

Recall compares them in that form as well. A question's vector is quantized the same way,
its dot product with every message's bytes is one pass of SIMD integer arithmetic
(NumKong), and each row's inverse length, kept beside it, turns the products into cosines.
At 10,000 messages the bytes are 1.3 MB where float32 rows were 5 MB: a product that
reads them from memory at every request takes about half the time (``bench/flat_cost.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numkong
import numpy as np
import numpy.typing as npt

DIM = 128
Codes = npt.NDArray[np.int8]
Floats = npt.NDArray[np.float32]


def quantize(vector: Floats) -> Codes | None:
    """The vector's first ``DIM`` components as bytes, the largest ±127 (None for a
    vector of zeros: a text with no words)."""
    head = vector[:DIM]
    top = float(np.abs(head).max()) if head.size else 0.0
    if top == 0.0 or not np.isfinite(top):
        return None
    # In float64: a float32 vector of subnormal parts has a scale past float32's range.
    return np.round(head.astype(np.float64) * (127.0 / top)).astype(np.int8)


def encode(vector: Floats) -> bytes:
    """The stored form of a vector; empty for a vector of zeros."""
    codes = quantize(vector)
    return b"" if codes is None else codes.tobytes()


def decode(raw: Sequence[bytes | None]) -> tuple[Codes, Floats]:
    """One row of codes per stored value, and each row's inverse length; a row of zeros
    (inverse length 0) where there is none, or it is malformed: such a message is found
    by its words only."""
    rows = np.zeros((len(raw), DIM), dtype=np.int8)
    for i, value in enumerate(raw):
        if value is not None and len(value) == DIM:
            rows[i] = np.frombuffer(value, dtype=np.int8)
    return rows, inverse_lengths(rows)


def inverse_lengths(rows: Codes) -> Floats:
    lengths = np.linalg.norm(rows.astype(np.float32), axis=1)
    inverse = np.zeros(len(rows), dtype=np.float32)
    np.divide(1.0, lengths, out=inverse, where=lengths > 0)
    return inverse


def cosines(rows: Codes, inverse: Floats, query: Floats) -> Floats:
    """The cosine of each row with the query (a unit vector); 0 for a row of zeros."""
    codes = quantize(query)
    if codes is None or not len(rows):
        return np.zeros(len(rows), dtype=np.float32)
    dots = numkong.cdist(codes[np.newaxis], rows, metric="dot", out_dtype="float32")
    found = np.asarray(dots, dtype=np.float32).reshape(-1)  # (a view: no copy)
    found *= inverse
    found *= 1.0 / float(np.linalg.norm(codes.astype(np.float32)))
    return found


def unit(vector: Floats) -> Floats | None:
    """The vector scaled to length 1 (None for a vector of zeros)."""
    norm = float(np.linalg.norm(vector))
    if norm == 0.0 or not np.isfinite(norm):
        return None
    return (vector[:DIM] / norm).astype(np.float32)
