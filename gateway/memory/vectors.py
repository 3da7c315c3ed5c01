"""Message vectors as Redis keeps them, and as recall compares them (pure).

A vector is stored as ``DIM`` signed bytes, scaled so that its largest component is
±127: recall compares directions only (cosine), so the scale is not kept. 128 bytes a
message instead of 512 as float32; on the REALTALK conversations the evidence recall puts
in context is the same to a tenth of a point either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

DIM = 128
Matrix = npt.NDArray[np.float32]


def encode(vector: npt.NDArray[np.float32]) -> bytes:
    """The stored form of a vector; empty for a vector of zeros (a text with no words)."""
    top = float(np.abs(vector).max()) if vector.size else 0.0
    if top == 0.0 or not np.isfinite(top):
        return b""
    return bytes(np.round(vector[:DIM] * (127.0 / top)).astype(np.int8).tobytes())


def decode(raw: Sequence[bytes | None]) -> Matrix:
    """Unit vectors, one row per stored value; a row of zeros where there is none (a
    missing or malformed value): such a message is found by its words only."""
    rows = np.zeros((len(raw), DIM), dtype=np.float32)
    for i, value in enumerate(raw):
        if value is not None and len(value) == DIM:
            rows[i] = np.frombuffer(value, dtype=np.int8)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    np.divide(rows, norms, out=rows, where=norms > 0)
    return rows


def unit(vector: npt.NDArray[np.float32]) -> npt.NDArray[np.float32] | None:
    """The vector scaled to length 1 (None for a vector of zeros)."""
    norm = float(np.linalg.norm(vector))
    if norm == 0.0 or not np.isfinite(norm):
        return None
    return (vector[:DIM] / norm).astype(np.float32)
