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
    assert not archive.codes.any()  # no stored vectors: rows of zeros
    assert not archive.inverse_lengths.any()


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
    assert np.array_equal(archive.codes, again.codes)
    assert np.array_equal(archive.inverse_lengths, again.inverse_lengths)
    assert archive.codes.shape == (40, vectors.DIM)
    assert archive.inverse_lengths.all()


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
    assert np.array_equal(cut.codes, fresh.codes)
    assert np.array_equal(cut.inverse_lengths, fresh.inverse_lengths)
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


# --- Bounded indexing (issue 22) --------------------------------------------------------


def test_a_long_text_is_indexed_in_pieces_as_it_would_be_whole() -> None:
    from collections import Counter

    from gateway.memory import archive as archive_module
    from gateway.memory.terms import stems, words

    rng = np.random.default_rng(7)
    text = " ".join(rng.choice([*WORDS, "cooking", "cooked", "Kate's"], size=20_000))
    text = text.replace("tea ", "tea\n", 500)
    assert len(text) > 4 * archive_module.PIECE_CHARS
    indexed = archive_module.index_text(text)
    found = stems(words(text))
    assert indexed.terms == Counter(found)
    assert indexed.length == len(found)
    assert indexed.words == len(text.split())


def test_distinct_terms_of_one_message_are_capped_most_frequent_first() -> None:
    from gateway.memory import archive as archive_module
    from gateway.memory.archive import MAX_TERMS, index_text

    many = [f"w{i}x" for i in range(MAX_TERMS + 500)]
    text = " ".join(["passport"] * 3 + many)
    long = " ".join([text] * 8)
    for indexed in (index_text(text), index_text(long)):  # whole, and in pieces
        assert len(indexed.terms) == MAX_TERMS
        assert "passport" in indexed.terms  # the most frequent, kept
        assert "w0x" in indexed.terms and f"w{MAX_TERMS + 499}x" not in indexed.terms
    assert len(long) > archive_module.PIECE_CHARS
    archive = Archive("g")
    archive.extend(messages([long]), [None])
    assert len(archive.postings) == MAX_TERMS
    assert archive.lengths[0] == 8 * (MAX_TERMS + 503)  # BM25's length: every term


def test_words_longer_than_anyone_searches_for_are_not_indexed() -> None:
    from gateway.memory.archive import index_text
    from gateway.memory.terms import MAX_WORD_CHARS

    letters = "q" * (MAX_WORD_CHARS + 1)
    indexed = index_text(f"passport {letters} drawer {'z' * 100_000}")
    assert set(indexed.terms) == {"passport", "drawer"}


def test_truncating_a_long_message_cuts_its_postings() -> None:
    long = " ".join(f"term{i}" for i in range(30_000))
    archive = build(["passport in the drawer", long, "rent is due"])
    archive.truncate(1)
    fresh = build(["passport in the drawer"])
    assert {t: p.tolist() for t, (p, _) in archive.postings.items()} == {
        t: p.tolist() for t, (p, _) in fresh.postings.items()
    }


# --- Recalled lines, made once (issue 33) -----------------------------------------------


class Counting:
    """A counter (a token a word) that notes what it is given."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, text: str) -> int:
        self.texts.append(text)
        return len(text.split())


def test_a_recalled_line_is_made_once_while_its_message_is_held() -> None:
    from gateway.memory.block import recalled_line

    archive, count = build(["my passport is\nin the drawer", "the rent"]), Counting()
    message = archive.messages[0]
    line = archive.line(message, None, True, count)
    assert line == recalled_line(message, None, True, count)
    assert line.piece == count(line.text + "\n") and line.tokens == message.tokens
    count.texts.clear()
    size = archive.nbytes
    assert archive.line(message, None, True, count) is line  # the next turns: found
    assert count.texts == [] and archive.nbytes == size


def test_each_way_of_showing_a_line_is_its_own() -> None:
    archive, count = build(["my passport", "the rent"]), Counting()
    message = archive.messages[1]
    own = archive.line(message, None, True, count)
    other = archive.line(message, "earlier", True, count)
    undated = archive.line(message, None, False, count)
    recounted = archive.line(message, None, True, Counting())
    assert (own.section, own.key, own.day) == ("recall", "2", "Tue 2023-11-14")
    assert (other.section, other.key) == ("recall_other", "earlier#2")
    assert undated.day == "" and recounted is not own and recounted == own
    assert archive.line(message, "earlier", True, count) is other


def test_lines_are_forgotten_with_the_messages_a_regenerate_replaced() -> None:
    from gateway.memory.archive import _PER_LINE_BYTES

    archive, count = build(["my passport", "the rent"]), Counting()
    old = archive.line(archive.messages[1], None, True, count)
    archive.truncate(1)
    assert archive.nbytes == build(["my passport"]).nbytes  # the line's bytes went too
    archive.extend(messages(["a new answer"], first=2), [None])
    new = archive.line(archive.messages[1], None, True, count)
    assert old.text == "user: the rent" and new.text == "user: a new answer"
    grown = Archive("g")
    grown.extend(messages(["my passport", "a new answer"]), [vector(0), None])
    assert archive.nbytes == grown.nbytes + len(new.text) + _PER_LINE_BYTES


def test_the_bytes_of_kept_lines_are_counted_and_bounded() -> None:
    from gateway.memory import archive as archive_module

    archive = build(["my passport", "the rent"])
    bare = archive.nbytes
    first = archive.line(archive.messages[0], None, True, Counting())
    assert archive.nbytes == bare + len(first.text) + archive_module._PER_LINE_BYTES
    # More ways than are kept at once: all are made again, their bytes gone with them.
    for _ in range(archive_module._LINE_WAYS):
        archive.line(archive.messages[0], None, True, Counting())
    assert archive.nbytes == bare + len(first.text) + archive_module._PER_LINE_BYTES
    archive.truncate(0)
    assert archive.nbytes == build([]).nbytes


def test_a_message_the_archive_does_not_hold_is_shown_but_not_kept() -> None:
    archive, count = build(["my passport"]), Counting()
    stranger = Message("user", "not held", index=9)
    size = archive.nbytes
    assert archive.line(stranger, None, False, count).text == "user: not held"
    assert archive.nbytes == size
