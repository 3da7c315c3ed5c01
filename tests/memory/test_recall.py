"""BM25 recall over the stored postings format (pure)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.memory.model import Message
from gateway.memory.recall import (
    K1,
    B,
    Hit,
    cosine,
    index_entries,
    indexed_length,
    pack,
    rank,
    rerank,
    terms,
    unpack,
)


def stored(messages: list[str]) -> tuple[dict[str, str], int, int]:
    """Postings as the record script stores them ("<df>|<absolute entries>")."""
    built: dict[str, list[str]] = {}
    objects = [Message("user", text, index=i + 1) for i, text in enumerate(messages)]
    for term, entries in index_entries(objects).items():
        absolute = []
        for entry in entries.split(","):
            if entry:
                offset, tf, length = entry.lstrip("+").split(":")
                absolute.append(f"{int(offset) + 1}:{tf}:{length},")
        built[term] = [f"{len(absolute)}|" + "".join(absolute)]
    return {t: v[0] for t, v in built.items()}, len(objects), indexed_length(objects)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("My seat is 14C!", ["seat", "14c"]),
        ("The Seats, the seats", ["seat", "seat"]),
        ("booking reference QX-48213", ["booking", "reference", "qx-48213"]),
        ("I'm allergic to penicillin", ["allergic", "penicillin"]),
        ("glasses and a glass", ["glass", "glass"]),
        ("the cities", ["city"]),
        ("", []),
    ],
)
def test_terms(text: str, expected: list[str]) -> None:
    assert terms(text) == tuple(expected)
    assert terms(" ".join([text] * 2000)) == tuple(expected) * 2000  # long: not remembered


def test_a_text_is_split_into_terms_once_while_remembered() -> None:
    cache_info = terms.cache_info  # type: ignore[attr-defined]
    text = "my booking reference is QX-48213, seat 14C"
    before = cache_info()
    assert terms(text) == terms(text) == ("booking", "reference", "qx-48213", "seat", "14c")
    after = cache_info()
    assert after.hits - before.hits >= 1
    long_text = text + " padding" * 1000
    terms(long_text)
    assert cache_info().currsize == after.currsize


def test_the_rare_word_wins_over_common_ones() -> None:
    filler = ["we talked about the meeting plan"] * 30
    messages = [*filler[:4], "my booking reference is QX-48213", *filler[4:]]
    postings, documents, length = stored(messages)
    query = "what was my booking reference for the meeting?"
    hits = rank(query, {t: postings.get(t) for t in terms(query)}, documents=documents,
                total_length=length)  # fmt: skip
    assert hits[0].index == 5
    assert hits[0].score > 2 * hits[1].score


def test_excluded_indexes_and_limit() -> None:
    postings, documents, length = stored(["alpha beta", "alpha gamma", "alpha delta", "zeta"])
    query = "alpha"
    found = {t: postings.get(t) for t in terms(query)}
    assert [h.index for h in rank(query, found, documents=documents, total_length=length)] == [
        3, 2, 1
    ]  # fmt: skip
    hits = rank(query, found, documents=documents, total_length=length, exclude=frozenset({3}))
    assert [h.index for h in hits] == [2, 1]
    assert len(rank(query, found, documents=documents, total_length=length, limit=1)) == 1


def test_no_match_and_empty_archive() -> None:
    postings, documents, length = stored(["alpha"])
    assert rank("omega", {"omega": None}, documents=documents, total_length=length) == []
    assert rank("alpha", postings, documents=0, total_length=0) == []


def test_document_frequency_comes_from_the_stored_count_not_the_kept_postings() -> None:
    # A common word whose old postings were trimmed still has its true, high df.
    trimmed = {"meeting": "900|999:1:5,1000:1:5,", "invoice": "1|400:1:5,"}
    hits = rank("meeting invoice", trimmed, documents=1000, total_length=5000)
    assert hits[0].index == 400


def test_vectors_round_trip_through_their_stored_form() -> None:
    vector = [0.5, -1.25, 3.0]
    assert unpack(pack(vector)) == vector
    assert cosine([1.0, 0.0], [1.0, 0.0]) == 1.0
    assert cosine([1.0, 0.0], [0.0, 1.0]) == 0.0
    assert cosine([0.0, 0.0], [1.0, 0.0]) == 0.0


def test_rerank_orders_candidates_by_meaning_and_keeps_unembedded_ones() -> None:
    hits = [Hit(5, 4.0), Hit(9, 3.8), Hit(12, 2.0)]
    query = [1.0, 0.0]
    vectors = {5: [0.0, 1.0], 9: [1.0, 0.0]}  # 12 has no vector yet
    reranked = rerank(hits, query, vectors, weight=0.5, limit=3)
    assert reranked[0].index == 9  # the lexically weaker one means what was asked
    assert {h.index for h in reranked} == {5, 9, 12}
    lexical_only = rerank(hits, query, vectors, weight=0.0, limit=2)
    assert [h.index for h in lexical_only] == [5, 9]
    assert rerank([], query, vectors, weight=0.5, limit=2) == []


def plain_bm25(
    query: str, postings: dict[str, str | None], documents: int, total_length: int,
    exclude: frozenset[int], limit: int,
) -> list[tuple[int, float]]:  # fmt: skip
    """Every entry of every term scored: what the pruned ranking must agree with."""
    average = max(total_length / documents, 1.0)
    scores: dict[int, float] = {}
    for term in set(terms(query)):
        raw = postings.get(term)
        if not raw:
            continue
        df_text, _, entries = raw.partition("|")
        df = int(df_text)
        idf = math.log(1 + (documents - df + 0.5) / (df + 0.5))
        for entry in filter(None, entries.split(",")):
            index, tf, length = (int(x) for x in entry.split(":"))
            if index not in exclude:
                norm = tf + K1 * (1 - B + B * length / average)
                scores[index] = scores.get(index, 0.0) + idf * tf * (K1 + 1) / norm
    return sorted(scores.items(), key=lambda item: (-item[1], -item[0]))[:limit]


VOCABULARY = ["meeting", "plan", "garden", "note", "14c", "seat", "invoice", "qx-48213"]


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(
        st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=12).map(" ".join),
        min_size=1,
        max_size=60,
    ),
    query=st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=6).map(" ".join),
    exclude=st.frozensets(st.integers(1, 60), max_size=10),
    limit=st.integers(1, 6),
    extra_documents=st.integers(0, 2000),
)
def test_pruned_ranking_agrees_with_scoring_every_entry(
    messages: list[str], query: str, exclude: frozenset[int], limit: int, extra_documents: int
) -> None:
    # extra_documents: an archive whose other messages share none of these words (rarer
    # words, larger idf gaps, more pruning).
    postings, documents, length = stored(messages)
    documents += extra_documents
    found: dict[str, str | None] = {t: postings.get(t) for t in terms(query)}
    every = dict(plain_bm25(query, found, documents, length, exclude, len(messages)))
    hits = rank(query, found, documents=documents, total_length=length, exclude=exclude,
                limit=limit)  # fmt: skip
    # The best scores, each hit with its true score. Which of two tied messages comes
    # first may differ: equal sums added in another order differ in the last bits.
    best = sorted(every.values(), reverse=True)[:limit]
    assert [h.score for h in hits] == pytest.approx(best, abs=1e-4)
    assert [h.score for h in hits] == pytest.approx([every[h.index] for h in hits], abs=1e-4)


def test_stale_postings_with_a_negative_idf_do_not_prune_the_real_top() -> None:
    # df above the indexed count: the term's idf is negative and must lower scores.
    found: dict[str, str | None] = {
        "meeting": "1|1:1:3,2:1:3,",
        "plan": "9|1:9:3,3:1:3,",
    }
    expected = plain_bm25("meeting plan", found, 5, 15, frozenset(), 1)
    hits = rank("meeting plan", found, documents=5, total_length=15, limit=1)
    assert [h.index for h in hits] == [index for index, _ in expected]
