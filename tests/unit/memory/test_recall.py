"""Recall: stemmed terms, the query, and the fused ranking over an archive (pure)."""

from __future__ import annotations

import datetime
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.memory import vectors
from gateway.memory.archive import Archive
from gateway.memory.model import Message
from gateway.memory.recall import (
    Hit,
    Query,
    Source,
    Weights,
    _best,
    build_query,
    lead_in,
    rank,
    vocabulary,
)
from gateway.memory.rerank import cosine, pack, rerank, unpack
from gateway.memory.terms import terms

WORDS_ONLY = Weights(
    semantic=0.0, neighbour=0.0, date_boost=0.0, feedback=0.0, around=0.0, spread=False
)


def archive_of(texts: list[str], raw_vectors: list[bytes | None] | None = None) -> Archive:
    archive = Archive("g1")
    messages = [
        Message("user" if i % 2 == 0 else "assistant", text, index=i + 1)
        for i, text in enumerate(texts)
    ]
    archive.extend(messages, raw_vectors or [None] * len(messages))
    return archive


def unit_bytes(*components: float) -> bytes:
    vector = np.zeros(vectors.DIM, dtype=np.float32)
    vector[: len(components)] = components
    return vectors.encode(vector)


def query_vector(*components: float) -> np.ndarray:
    vector = np.zeros(vectors.DIM, dtype=np.float32)
    vector[: len(components)] = components
    found = vectors.unit(vector)
    assert found is not None
    return found


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("My seat is 14C!", ["seat", "14c"]),
        ("The Seats, the seats", ["seat", "seat"]),
        ("booking reference QX-48213", ["book", "refer", "qx-48213"]),
        ("I'm allergic to penicillin", ["allerg", "penicillin"]),
        ("cooking, cooked and cooks", ["cook", "cook", "cook"]),
        ("the cities", ["citi"]),
        ("Kate's hobbies", ["kate", "hobbi"]),
        ("Kate\u2019s hobby", ["kate", "hobbi"]),
        ("", []),
    ],
)
def test_terms_are_stemmed_words_without_stopwords(text: str, expected: list[str]) -> None:
    assert terms(text) == tuple(expected)
    assert terms(" ".join([text] * 2000)) == tuple(expected) * 2000  # long: not remembered


def test_a_word_said_in_another_form_is_found() -> None:
    archive = archive_of(["We went skiing in Colorado", "The weather was nice", "I ski a lot"])
    hits = rank([Source(archive)], build_query("Does she still ski?"), limit=3, weights=WORDS_ONLY)
    assert {hit.index for hit in hits} == {1, 3}


def test_the_rare_word_wins_over_common_ones() -> None:
    texts = ["the weather today is nice"] * 8 + ["my dentist is on Elm street, weather aside"]
    hits = rank([Source(archive_of(texts))], build_query("weather dentist"), limit=1)
    assert hits[0].index == 9


def test_bm25_matches_the_formula() -> None:
    texts = ["alpha beta", "alpha gamma gamma", "delta"]
    archive = archive_of(texts)
    (hit, *_) = rank([Source(archive)], Query({"gamma": 1.0}), limit=3, weights=WORDS_ONLY)
    n, df, average = 3, 1, (2 + 3 + 1) / 3
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    tf, length = 2, 3
    expected = idf * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * length / average))
    assert hit.index == 2
    assert hit.score == pytest.approx(1.0)  # the best word score is scaled to 1
    scores = rank(
        [Source(archive)], Query({"gamma": 1.0, "alpha": 1.0}), limit=3, weights=WORDS_ONLY
    )
    alpha_idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    first = alpha_idf * 2.2 / (1 + 1.2 * (1 - 0.75 + 0.75 * 2 / average))
    second = alpha_idf * 2.2 / (1 + 1.2 * (1 - 0.75 + 0.75 * 3 / average)) + expected
    assert [h.index for h in scores] == [2, 1]
    assert scores[1].score == pytest.approx(first / second, rel=1e-4)


def test_a_hit_lifts_its_neighbours_above_unrelated_messages() -> None:
    texts = ["unrelated words here", "where is the passport?", "in the blue drawer", "more noise"]
    weights = Weights(semantic=0.0, neighbour=0.3, date_boost=0.0, feedback=0.0, around=0.0)
    hits = rank([Source(archive_of(texts))], build_query("passport"), limit=4, weights=weights)
    assert [h.index for h in hits] == [2, 3, 1]  # the hit, then its neighbours (newer first)
    assert hits[1].score == pytest.approx(0.3)


def test_the_second_pass_follows_the_best_hits_words_to_the_answer() -> None:
    """ "Which city am I travelling to next month?" finds "visiting my sister next month";
    its words lead to "my sister lives in Lyon", which shares none with the question."""
    filler = [f"the weekly planning notes, part {i}" for i in range(20)]
    texts = ["my sister lives in Lyon", *filler, "I'm visiting my sister next month", *filler]
    query = build_query("Which city am I travelling to next month?")
    weights = Weights(semantic=0.0, neighbour=0.0, date_boost=0.0)
    with_feedback = rank([Source(archive_of(texts))], query, limit=3, weights=weights)
    assert [h.index for h in with_feedback[:2]] == [22, 1]
    without = rank([Source(archive_of(texts))], query, limit=3, weights=WORDS_ONLY)
    assert 1 not in [h.index for h in without]


def test_meaning_finds_what_shares_no_word() -> None:
    texts = ["I went skiing again", "The rent is due", "Lunch was fine"]
    stored = [unit_bytes(1, 0.1), unit_bytes(0, 1), unit_bytes(0.1, 0, 1)]
    archive = archive_of(texts, stored)
    query = Query({"hobbi": 1.0}, query_vector(1, 0))
    hits = rank([Source(archive)], query, limit=3, weights=Weights(neighbour=0.0))
    assert hits[0].index == 1
    assert archive.codes.shape == (3, vectors.DIM)


def test_a_message_without_a_vector_is_found_by_its_words() -> None:
    archive = archive_of(["the passport is in the drawer", "nothing"], [None, unit_bytes(1)])
    query = Query({"passport": 1.0}, query_vector(1))
    hits = rank([Source(archive)], query, limit=2, weights=Weights(neighbour=0.0))
    assert {h.index for h in hits} == {1, 2}


def test_excluded_messages_are_not_hits() -> None:
    archive = archive_of(["passport one", "passport two", "passport three"])
    hits = rank([Source(archive, frozenset({3}))], build_query("passport"), limit=3)
    assert [h.index for h in hits] == [2, 1]


def test_ties_go_to_the_newer_message_and_limit_holds() -> None:
    archive = archive_of(["passport"] * 5)
    hits = rank([Source(archive)], build_query("passport"), limit=2, weights=WORDS_ONLY)
    assert [h.index for h in hits] == [5, 4]


def test_an_empty_query_or_archive_finds_nothing() -> None:
    assert rank([Source(archive_of(["a b"]))], Query({}), limit=3) == []
    assert rank([Source(archive_of([]))], build_query("passport"), limit=3) == []


def test_word_scores_share_one_scale_across_sessions() -> None:
    strong = archive_of(["passport passport here", "noise"])
    weak = archive_of(["my passport", "other", "words", "passport maybe", "more words"])
    hits = rank(
        [Source(strong), Source(weak)], build_query("passport"), limit=4, weights=WORDS_ONLY
    )
    # BM25 depends on each archive's statistics (here "passport" is rarer in the second):
    # one scale means the best word match anywhere scores 1, and only it.
    assert hits[0].score == 1.0
    assert all(h.score < 1.0 for h in hits[1:])
    assert {h.source for h in hits} == {0, 1}


def day(text: str) -> float:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC).timestamp()


def test_a_named_date_lifts_that_day_and_the_next() -> None:
    archive = Archive("g")
    said = ["2024-01-04T10:00", "2024-01-05T23:00", "2024-01-06T00:30", "2024-01-08T10:00"]
    archive.extend(
        [Message("user", "we talked", index=i + 1, ts=day(t)) for i, t in enumerate(said)],
        [None] * 4,
    )
    query = build_query("What did we talk about on 5 Jan 2024?")
    weights = Weights(semantic=0.0, neighbour=0.0, date_boost=0.2, feedback=0.0)
    hits = rank([Source(archive)], query, limit=4, weights=weights)
    # "talk" asks about the talk itself (every message is): the day is all it names.
    assert [h.index for h in hits] == [3, 2]


@pytest.mark.parametrize(
    ("asked", "lifted"),
    [
        ("What did I cook shortly before 7 Jan 2024?", {2, 3}),  # the week before, the 7th
        ("What did I cook after 7 Jan 2024?", {3, 4}),  # the 7th, the week after
        ("What did I cook on 7 Jan 2024?", {3}),  # the day, and the next
        ("What did I cook the day before 13 Jan 2024?", {4}),  # the 12th, and the next
        ("What did I cook between 3 Jan 2024 and 12 Jan 2024?", {2, 3, 4}),  # the days between
    ],
)
def test_words_around_named_dates_lift_the_days_they_name(asked: str, lifted: set[int]):
    archive = Archive("g")
    said = ["2023-12-20T19", "2024-01-04T19", "2024-01-07T19", "2024-01-12T09", "2024-01-25T19"]
    archive.extend(
        [Message("user", "I cooked a stew", index=i + 1, ts=day(t)) for i, t in enumerate(said)],
        [None] * 5,
    )
    weights = Weights(semantic=0.0, neighbour=0.0, feedback=0.0, around=0.0)
    hits = rank([Source(archive)], build_query(asked), limit=5, weights=weights)
    unlifted = min(h.score for h in hits)
    assert {h.index for h in hits if h.score > unlifted} == lifted


def test_a_time_said_relative_to_the_conversations_present_lifts_its_days() -> None:
    archive = Archive("g")
    said = [
        ("2023-03-01T19:00", "For dinner I ate sushi, the best dinner in weeks"),
        ("2023-03-05T19:00", "For dinner I ate pizza"),
        ("2023-03-06T09:00", "morning"),
    ]
    archive.extend(
        [Message("user", text, index=i + 1, ts=day(t)) for i, (t, text) in enumerate(said)],
        [None] * 3,
    )
    weights = Weights(semantic=0.0, neighbour=0.0, feedback=0.0)
    today = datetime.date(2023, 3, 6).toordinal()  # the newest message's, not the clock's
    asked = build_query("What did I eat for dinner yesterday?", today=today)
    assert [h.index for h in rank([Source(archive)], asked, limit=2, weights=weights)] == [2, 1]
    # Without the present, "yesterday" names no day: the better match of words wins.
    unknown = build_query("What did I eat for dinner yesterday?")
    assert rank([Source(archive)], unknown, limit=1, weights=weights)[0].index == 1


def test_a_hit_lifts_the_messages_around_it_above_equal_ones_far_from_any() -> None:
    """ "Do you play a sport?" … "I play volleyball": the evidence shares a word or none
    with the question, but lies near the messages that do."""
    texts = [f"the weekly planning notes, part {i}" for i in range(60)]
    texts[10] = "do you play any sport, or watch sport?"
    texts[12] = "I play volleyball on Sundays"
    texts[40] = "I play the piano"
    weights = Weights(semantic=0.0, neighbour=0.0, feedback=0.0)
    hits = rank(
        [Source(archive_of(texts))],
        build_query("what sport do you play?"),
        limit=3,
        weights=weights,
    )
    assert [h.index for h in hits[:2]] == [11, 13]  # not 41, newer but far from any hit
    flat = rank(
        [Source(archive_of(texts))],
        build_query("what sport do you play?"),
        limit=3,
        weights=Weights(semantic=0.0, neighbour=0.0, feedback=0.0, around=0.0),
    )
    assert [h.index for h in flat[:2]] == [11, 41]  # (without: a tie, the newer first)
    assert weights.around > 0


def test_a_word_of_every_stretch_counts_less_than_one_of_a_few() -> None:
    """The other person's name, said in each greeting, tells less about where the answer
    lies than a word of one stretch's talk, though rarer message by message."""
    texts = [f"the weekly planning notes, part {i}" for i in range(100)]
    texts[5] = "hi kate, how are you"
    texts[65] = "bye kate, see you"
    texts[30] = "we went skiing in the alps"
    texts[31] = "skiing is hard work"
    texts[33] = "skiing again next year?"
    query = build_query("Did Kate like skiing?")
    weights = Weights(semantic=0.0, neighbour=0.0, feedback=0.0, around=0.0)
    hits = rank([Source(archive_of(texts))], query, limit=1, weights=weights)
    assert hits[0].index in (31, 32, 34)
    plain = rank(
        [Source(archive_of(texts))], query, limit=1, weights=replace(weights, spread=False)
    )
    assert plain[0].index in (6, 66)  # by idf alone, "kate" (2 messages) beats "ski" (3)


def test_words_that_ask_about_the_talk_itself_are_not_searched() -> None:
    query = build_query("When did Kate first mention her trip? What did we discuss?")
    assert "mention" not in query.terms and "discuss" not in query.terms
    assert {"kate", "trip"} <= set(query.terms)
    texts = ["I mentioned it to my boss", "the trip to Lyon was lovely"]
    hits = rank([Source(archive_of(texts))], build_query("when did I mention the trip?"), limit=1)
    assert hits[0].index == 2


def test_feedback_terms_of_equal_weight_are_chosen_the_same_in_every_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hit's terms are a set, iterated in an order that changes with the process's hash
    seed: the terms chosen, and so the hits, must not."""
    from gateway.memory import recall

    texts = ["passport " + " ".join(f"w{i}" for i in range(30))]
    archive = archive_of(texts)
    fused = [np.ones(1)]
    query = Query({"passport": 1.0})
    chosen = []
    for order in (sorted, lambda terms: sorted(terms, reverse=True)):
        monkeypatch.setattr(recall, "distinct_terms", lambda text, o=order: o(terms(text)))
        chosen.append(recall._feedback_terms([Source(archive)], fused, query))
    assert len(chosen[0]) == recall.FEEDBACK_TERMS  # 30 terms of equal weight, 10 chosen
    assert chosen[0] == chosen[1]


def test_a_follow_up_is_read_with_the_turns_before_it() -> None:
    context = ["My sister lives in Lyon.", "How nice! Do you visit her?"]
    follow_up = build_query("and what about her?", context)
    assert follow_up.terms["lyon"] == pytest.approx(0.2)  # 5 terms share one term's weight
    assert build_query("and her sister?", context).terms["lyon"] == pytest.approx(0.25)
    full = build_query("Which city does my sister live in these days?", context)
    assert "lyon" not in full.terms  # a question that says enough stands alone
    short = build_query("Where is my automobile parked?", context)
    assert set(short.terms) == {"automobil", "park"}  # short, but pointing nowhere


def test_the_query_vector_leaves_out_words_the_archive_never_uses() -> None:
    embedded: list[str] = []

    def embed(text: str) -> np.ndarray | None:
        embedded.append(text)
        return query_vector(1)

    archive = archive_of(["I love hiking and cooking"])
    build_query("What are Kate's hobbies?", known=vocabulary([archive]), embed=embed)
    assert embedded == ["What are Kate's hobbies?"]  # no word known: the whole question
    build_query("Does Kate like hiking?", known=vocabulary([archive]), embed=embed)
    assert embedded[-1] == "hiking"


def test_a_short_hit_comes_with_the_message_it_answers() -> None:
    archive = archive_of(["How many times have you been to Turks and Caicos?", "Twice!", "ok"])
    assert lead_in(archive, 2) == archive.message(1)
    assert lead_in(archive, 1) is None  # the first message answers nothing
    long = archive_of(["question?", "Twice, once in 2019 and once with my sister"])
    assert lead_in(long, 2) is None


# --- the optional /v1/embeddings reranker -------------------------------------------------


def test_pack_roundtrip_and_cosine() -> None:
    assert unpack(pack([1.0, -0.5, 0.25])) == [1.0, -0.5, 0.25]
    assert cosine([1, 0], [1, 0]) == pytest.approx(1.0)
    assert cosine([1, 0], [0, 1]) == pytest.approx(0.0)
    assert cosine([0, 0], [1, 0]) == 0.0


def test_rerank_orders_this_sessions_candidates_by_meaning() -> None:
    hits = [Hit(0, 1, 2.0), Hit(0, 2, 1.9), Hit(1, 3, 1.8)]
    vectors_by_index = {1: [0.0, 1.0], 2: [1.0, 0.0]}
    reordered = rerank(hits, [1.0, 0.0], vectors_by_index, weight=1.0)
    assert [h.index for h in reordered] == [2, 3, 1]  # another session's keeps its score
    assert rerank([], [1.0], {}, weight=0.5) == []


# --- the best k of many scores ---------------------------------------------------------


def _best_by_sorting(scores: list[float], limit: int) -> list[tuple[int, float]]:
    """What ``_best`` must give, the plain way: positive scores, best first, of equal
    scores the newer message first."""
    order = sorted((p for p, s in enumerate(scores) if s > 0), key=lambda p: (-scores[p], -p))
    return [(p, round(scores[p], 6)) for p in order[:limit]]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([0.0, -1.0, 0.5, 0.25]),  # ties and exclusions, often
            st.floats(min_value=-1, max_value=3, allow_nan=False),
        ),
        max_size=400,
    ),
    st.integers(min_value=1, max_value=64),
)
def test_the_best_hits_are_those_a_full_sort_gives(scores: list[float], limit: int) -> None:
    hits = _best(0, 1, np.array(scores, dtype=np.float64), limit)
    assert [(h.index - 1, h.score) for h in hits] == _best_by_sorting(scores, limit)


# --- BM25 over every term at once (issue 33) ----------------------------------------------

BM25_WORDS = ["passport", "drawer", "lyon", "sister", "ski", "tea", "rent", "14c", "blue"]


def bm25_term_by_term(archive: Archive, query: Query, weights: Weights) -> np.ndarray:
    """BM25 as it reads in a textbook: each term's postings added in turn."""
    n = len(archive.messages)
    scores = np.zeros(n, dtype=np.float64)
    if n == 0:
        return scores
    lengths = np.frombuffer(archive.lengths, dtype=np.uint32)
    flat = weights.k1 * (1 - weights.b)
    per_term = weights.k1 * weights.b / max(archive.total_length / n, 1.0)
    for term, weight in query.terms.items():
        if term not in archive.postings:
            continue
        positions = np.frombuffer(archive.postings[term][0], dtype=np.uint32)
        tf = np.frombuffer(archive.postings[term][1], dtype=np.uint32).astype(np.float64)
        df = len(positions)
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        norm = flat + per_term * lengths[positions]
        scores[positions] += weight * idf * tf * (weights.k1 + 1) / (tf + norm)
    return scores


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(BM25_WORDS), max_size=8).map(" ".join), max_size=30),
    st.dictionaries(
        st.sampled_from([*BM25_WORDS, "absent"]),
        st.sampled_from([1.0, 0.5, 1 / 3, 0.1]),
        max_size=len(BM25_WORDS) + 1,
    ),
)
def test_every_term_scored_at_once_is_each_term_added_in_turn(
    texts: list[str], weighted: dict[str, float]
) -> None:
    """The same scores to the last bit: a message's terms add up in the query's order."""
    from gateway.memory.recall import _words_score

    archive = archive_of(texts)
    query = Query(weighted)
    found = _words_score(archive, query, Weights())
    expected = bm25_term_by_term(archive, query, Weights())
    assert found.dtype == expected.dtype and found.tobytes() == expected.tobytes()
