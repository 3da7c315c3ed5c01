"""Optional: recall's best candidates reordered by an embeddings model (pure).

With ``memory.tiers.recall.embeddings`` configured, a worker job asks ``/v1/embeddings``
for each recorded message's vector, and a request asks it for the question's; with
``memory.tiers.recall.encoder``, a sentence encoder computes both in-process
(``text/encoder.py``). The candidates ``recall.rank`` found are then reordered, ``weight``
of each score coming from that model's cosine. Off by default: the in-process word
vectors (``embedder``) need no model and no job.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from gateway.memory.recall import Hit

# As a model sent it, or as the store read it (``unpacked``).
Vector = Sequence[float] | npt.NDArray[np.float32]


def pack(vector: Sequence[float]) -> bytes:
    """A vector as Redis keeps it: little-endian float32."""
    return struct.pack(f"<{len(vector)}f", *vector)


def unpack(raw: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def unpacked(raw: bytes) -> npt.NDArray[np.float32]:
    """``unpack`` as an array over the bytes, without a copy (what ``rerank`` reads); a
    malformed value's last partial float left out."""
    return np.frombuffer(raw[: len(raw) // 4 * 4], dtype="<f4")


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(x @ y) / norm if norm else 0.0


def _cosines(hits: Sequence[Hit], query: Vector, vectors: Mapping[int, Vector]) -> dict[int, float]:
    """Each hit's cosine with the query, by its position in ``hits``, in one product (a
    Python loop over an encoder's 384 components took 20 ms for 250 candidates)."""
    q = np.asarray(query, dtype=np.float32)
    found: dict[int, Vector] = {}
    for at, hit in enumerate(hits):
        vector = vectors.get(hit.index) if hit.source == 0 else None
        if vector is not None and len(vector) == len(q):
            found[at] = vector
    if not found:
        return {}
    rows = np.stack([np.asarray(v, dtype=np.float32) for v in found.values()])
    norms = np.linalg.norm(rows, axis=1) * np.linalg.norm(q)
    products = rows @ q
    cosines = np.divide(products, norms, out=np.zeros_like(products), where=norms > 0)
    return dict(zip(found, cosines.tolist(), strict=True))


def rerank(
    hits: Sequence[Hit],
    query: Vector,
    vectors: Mapping[int, Vector],
    *,
    weight: float,
) -> list[Hit]:
    """The hits of source 0 reordered by meaning: ``weight`` of the score is the cosine.

    A hit without a vector (its embedding job has not run yet, or another session's), or
    with one of another length (stored by another model before the configuration
    changed), keeps its own score.
    """
    if not hits:
        return []
    top = max(hit.score for hit in hits) or 1.0
    cosines = _cosines(hits, query, vectors)
    scored = []
    for at, hit in enumerate(hits):
        own = hit.score / top
        semantic = cosines.get(at, own)
        scored.append(Hit(hit.source, hit.index, round((1 - weight) * own + weight * semantic, 6)))
    return sorted(scored, key=lambda h: (-h.score, -h.index))
