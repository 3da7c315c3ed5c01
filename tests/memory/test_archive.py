"""The in-memory archive recall searches, and the bounded cache of archives (pure)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.memory import vectors
from gateway.memory.archive import Archive, ArchiveCache, day_of
from gateway.memory.model import Message

WORDS = ["passport", "drawer", "Lyon", "sister", "ski", "skiing", "tea", "14C", "the", "rent"]


def messages(texts: list[str], first: int = 1) -> list[Message]:
    return [
        Message("user", text, index=first + i, ts=1_700_000_000 + 3600 * i)
        for i, text in enumerate(texts)
    ]


def vector(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return vectors.encode(rng.standard_normal(vectors.DIM).astype(np.float32))


def build(texts: list[str]) -> Archive:
    archive = Archive("g")
    archive.extend(messages(texts), [vector(i) for i in range(len(texts))])
    return archive


def test_an_archive_holds_its_messages_by_index() -> None:
    archive = Archive("g", first=11)
    archive.extend(messages(["a passport", "the drawer"], first=11), [None, None])
    assert archive.count == 12
    assert archive.message(11) is not None and archive.message(11).text == "a passport"
    assert archive.message(10) is None and archive.message(13) is None
    assert [m.index for m in archive.tail(1)] == [12]
    assert archive.postings["passport"][0].tolist() == [0]
    assert archive.days.tolist() == [day_of(1_700_000_000), day_of(1_700_003_600)]
    assert not archive.vectors.any()  # no stored vectors: rows of zeros


def test_an_empty_archive_counts_from_its_first_index() -> None:
    archive = Archive("g", first=5)
    assert archive.count == 4
    assert archive.tail(3) == ()


def test_growing_past_the_first_allocation_keeps_every_vector() -> None:
    texts = [f"message {i}" for i in range(40)]
    archive = build(texts)
    again = Archive("g")
    for i, text in enumerate(texts):  # one at a time, as turns arrive
        again.extend(messages([text], first=i + 1), [vector(i)])
    assert np.array_equal(archive.vectors, again.vectors)
    assert archive.vectors.shape == (40, vectors.DIM)


@given(st.lists(st.lists(st.sampled_from(WORDS), max_size=6), max_size=25), st.data())
@settings(max_examples=150, deadline=None)
def test_truncating_is_building_the_shorter_archive(
    texts: list[list[str]], data: st.DataObject
) -> None:
    joined = [" ".join(words) for words in texts]
    keep = data.draw(st.integers(min_value=0, max_value=len(joined)))
    cut = build(joined)
    cut.truncate(keep)
    fresh = build(joined[:keep])
    assert cut.count == fresh.count == keep
    assert [m.text for m in cut.messages] == [m.text for m in fresh.messages]
    assert {t: (p.tolist(), f.tolist()) for t, (p, f) in cut.postings.items()} == {
        t: (p.tolist(), f.tolist()) for t, (p, f) in fresh.postings.items()
    }
    assert cut.lengths == fresh.lengths and cut.total_length == fresh.total_length
    assert cut.days == fresh.days and cut.words == fresh.words
    assert np.array_equal(cut.vectors, fresh.vectors)
    assert cut.nbytes == fresh.nbytes
    cut.extend(messages(["the passport again"], first=keep + 1), [None])  # and it grows again
    assert cut.count == keep + 1


def test_the_cache_evicts_least_recently_used_archives_past_its_bytes() -> None:
    small = build(["a"] * 10)
    size = small.nbytes
    cache: ArchiveCache[str] = ArchiveCache(max_bytes=3 * size)
    for key in ("one", "two", "three"):
        cache.put(key, build(["a"] * 10))
    assert cache.get("one") is not None  # now the most recently used
    cache.put("four", build(["a"] * 10))
    assert "two" not in cache and {"one", "three", "four"} <= {
        k for k in ("one", "three", "four") if k in cache
    }
    assert cache.nbytes == 3 * size


def test_an_archive_growing_in_place_is_counted_and_may_push_others_out() -> None:
    cache: ArchiveCache[str] = ArchiveCache(max_bytes=build(["a"] * 20).nbytes)
    cache.put("old", build(["a"] * 10))
    growing = build(["a"] * 5)
    cache.put("new", growing)
    assert len(cache) == 2
    growing.extend(messages(["a"] * 10, first=6), [None] * 10)
    cache.resized("new")
    assert "old" not in cache and "new" in cache
    assert cache.nbytes == growing.nbytes


def test_an_archive_larger_than_the_whole_cache_is_not_kept() -> None:
    cache: ArchiveCache[str] = ArchiveCache(max_bytes=10)
    cache.put("huge", build(["a long message"] * 3))
    assert len(cache) == 0 and cache.nbytes == 0
    cache.discard("huge")  # discarding what is not there is fine
    cache.resized("missing")
