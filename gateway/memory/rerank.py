"""Optional: recall's best candidates reordered by an embeddings model (pure).

With ``memory.tiers.recall.embeddings`` configured, a worker job asks ``/v1/embeddings``
for each recorded message's vector, and a request asks it for the question's; the
candidates ``recall.rank`` found are then reordered, ``weight`` of each score coming from
that model's cosine. Off by default: the in-process vectors (``embedder``) need no
upstream call and no job.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence

from gateway.memory.recall import Hit


def pack(vector: Sequence[float]) -> bytes:
    """A vector as Redis keeps it: little-endian float32."""
    return struct.pack(f"<{len(vector)}f", *vector)


def unpack(raw: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def rerank(
    hits: Sequence[Hit],
    query: Sequence[float],
    vectors: Mapping[int, Sequence[float]],
    *,
    weight: float,
) -> list[Hit]:
    """The hits of source 0 reordered by meaning: ``weight`` of the score is the cosine.

    A hit without a vector (its embedding job has not run yet, or another session's)
    keeps its own score.
    """
    if not hits:
        return []
    top = max(hit.score for hit in hits) or 1.0
    scored = []
    for hit in hits:
        own = hit.score / top
        vector = vectors.get(hit.index) if hit.source == 0 else None
        semantic = cosine(query, vector) if vector is not None else own
        scored.append(Hit(hit.source, hit.index, round((1 - weight) * own + weight * semantic, 6)))
    return sorted(scored, key=lambda h: (-h.score, -h.index))
