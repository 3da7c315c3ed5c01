"""The inspector's pure view helpers."""

from __future__ import annotations

from gateway.ui.views import (
    CacheUse,
    HitRate,
    Segment,
    budget_bar,
    cache_use,
    hit_rate,
    index_range,
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
