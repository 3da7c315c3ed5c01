"""The in-process word vectors recall uses: read from the installed wheel, no network."""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_info

from gateway.embedder import StaticEmbedder, single_threaded_blas
from gateway.memory import vectors


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


def test_blas_runs_on_the_calling_thread_only() -> None:
    single_threaded_blas()
    blas = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
    assert blas, "numpy's BLAS not found"
    assert all(pool["num_threads"] == 1 for pool in blas)
    product = np.ones((4096, 64), np.float32) @ np.ones(64, np.float32)
    assert product.shape == (4096,) and float(product[0]) == 64.0  # and still computes
