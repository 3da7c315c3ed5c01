"""The collector settings a serving process starts with."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gateway.http import gc_tuning as collector


@pytest.fixture
def restored() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored")
def test_start_up_objects_are_frozen_and_collections_made_rarer() -> None:
    gc.unfreeze()
    kept = [object() for _ in range(3)] + [[] for _ in range(100)]
    collector.tune_for_serving()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold() == collector.THRESHOLDS
    assert collector.THRESHOLDS[0] > 700  # CPython's default
    # Cycles made after start-up are still found.
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1
