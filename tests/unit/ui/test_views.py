"""The inspector's pure view helpers."""

from __future__ import annotations

from gateway.ui.views import (
    ANSWER,
    NEW,
    CacheUse,
    HitRate,
    Segment,
    budget_bar,
    cache_use,
    hit_rate,
    index_range,
    window_tags,
)


def test_the_budget_bar_splits_memory_by_section_and_shows_what_is_left() -> None:
    receipt = {
        "tiers": {"prompt": 10, "memory": 100, "window": 300, "new": 20},
        "budget_tokens": 1000,
        "memory_sections": {"pins": 30, "summaries": 60},  # estimates: scaled to 100
    }
    bar = budget_bar(receipt)
    assert [(s.tier, s.tokens) for s in bar] == [
        ("prompt", 10),
        ("memory:pins", 33),
        ("memory:summaries", 67),  # the rounding goes to the last section
        ("window", 300),
        ("new", 20),
        ("free", 570),
    ]
    assert sum(s.tokens for s in bar) == 1000
    assert bar[3] == Segment("window", 300, 30.0)


def test_a_context_over_budget_fills_the_bar_and_empty_tiers_are_left_out() -> None:
    bar = budget_bar({"tiers": {"prompt": 0, "window": 900, "new": 300}, "budget_tokens": 1000})
    assert [(s.tier, s.percent) for s in bar] == [("window", 75.0), ("new", 25.0)]
    memory_unsplit = budget_bar({"tiers": {"memory": 50}, "budget_tokens": 50})
    assert [(s.tier, s.tokens) for s in memory_unsplit] == [("memory", 50)]


def test_window_ranges_read_as_the_receipt_header_writes_them() -> None:
    assert index_range([]) == "" and index_range([3, 4, 9]) == "3-9"


def test_a_receipts_cache_numbers_and_the_hit_rate_over_those_the_upstream_reported() -> None:
    reported = {"usage": {"prompt_tokens": 2000, "cached_tokens": 1536, "completion_tokens": 9},
                "receipt": {"stable_tokens": 1600}}  # fmt: skip
    silent = {"usage": {"prompt_tokens": 900, "cached_tokens": None, "completion_tokens": 9},
              "receipt": {"stable_tokens": None}}  # fmt: skip
    older = {"receipt": {"total_tokens": 50}}  # stored before usage was kept
    garbage = {"usage": {"prompt_tokens": "lots", "cached_tokens": True}, "receipt": []}
    uses = [cache_use(r) for r in (reported, silent, older, garbage)]
    assert uses == [
        CacheUse(2000, 1536, 1600),
        CacheUse(900, None, None),
        CacheUse(None, None, None),
        CacheUse(None, None, None),
    ]
    rate = hit_rate(uses)  # the silent turn's prompt is not counted against the cache
    assert rate == HitRate(1536, 2000) and rate.percent == 76.8
    assert hit_rate(uses[1:]) is None and hit_rate([]) is None


def window(*roles: str, first: int = 1) -> list[dict[str, object]]:
    return [{"index": first + i, "role": role} for i, role in enumerate(roles)]


def test_the_last_requests_own_message_is_sent_and_its_answer_is_the_answer() -> None:
    """Issue 34: the newest user message was tagged "not sent last time": it had no index
    when the request was assembled, so the receipt could not list it."""
    shown = window("user", "assistant", "user", "assistant", "user", "assistant", first=5)
    tags = window_tags(shown, {"window_indexes": [6, 7, 8]})
    assert {i: t.text for i, t in tags.items()} == {
        5: "not sent last time",
        6: "sent",
        7: "sent",
        8: "sent",
        9: "sent: new in the last request",
        10: "the last request's answer",
    }
    assert tags[9].kind == tags[10].kind == "sent" and tags[5].kind == "unsent"


def test_a_first_turn_and_messages_added_after_the_last_request() -> None:
    # The session's first turn forwarded no stored message: its two are its own.
    tags = window_tags(window("user", "assistant"), {"window_indexes": []})
    assert [tags[1], tags[2]] == [NEW, ANSWER]
    # A tool round and then messages imported since: the latter get no tag.
    shown = window("user", "assistant", "tool", "assistant", "user", "assistant")
    tags = window_tags(shown, {"window_indexes": [1, 2]})
    assert [tags[3], tags[4]] == [NEW, ANSWER]
    assert 5 not in tags and 6 not in tags
