"""What the service needs of the clients it is given: each a Protocol, so a test passes a
small fake of its own and the service never names a concrete client."""

from __future__ import annotations

from typing import Protocol


class Embedder(Protocol):
    """An embeddings model (``memory.tiers.recall.embeddings``): one vector per text."""

    async def embed(self, texts: list[str]) -> list[list[float]]: ...
