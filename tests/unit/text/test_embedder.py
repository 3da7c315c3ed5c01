"""The in-process word vectors recall uses: read from the installed wheel, no network."""

from __future__ import annotations

from gateway.memory import vectors
from gateway.text.embedder import StaticEmbedder


def test_loads_from_the_installed_package_and_places_meanings() -> None:
    embedder = StaticEmbedder.load()
    assert embedder is not None
    dog, puppy, tax = (embedder.query(t) for t in ("my dog", "a puppy", "tax return forms"))
    assert dog is not None and puppy is not None and tax is not None
    assert dog.shape == (vectors.DIM,)
    assert float(dog @ puppy) > float(dog @ tax)
    assert embedder.query("") is None  # no words: no direction
    stored = embedder.encode(["my dog", ""])
    assert len(stored[0]) == vectors.DIM and stored[1] == b""
