"""bench/flat_cost.py's ratios of the largest session to the smallest, in its live
conditions too, where the summary jobs' CPU is not measured (the worker runs them)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.flat_cost import RATIO_KEYS, flat_cost_table, ratios


def row(messages: int, value: float, *, live: bool) -> dict[str, Any]:
    measured = dict.fromkeys(RATIO_KEYS, value)
    jobs = {"summary_jobs": None, "job_cpu_ms": None} if live else {"summary_jobs": 3}
    return measured | jobs | {
        "messages": messages, "pending_jobs_loaded": 40, "pending_jobs_end": 35,
        "tiers_kb": value, "index_kb": 0.0, "log_kb": 1.0, "recall_present": 1.0,
        "full_history_bytes": 2048,
    }  # fmt: skip


def test_a_measure_missing_at_either_end_has_no_ratio() -> None:
    rows = [row(10, 2.0, live=True), row(10_000, 3.0, live=True)]
    found = ratios(rows, 0)
    assert found["added_p50_ms"] == pytest.approx(1.5)
    assert found["job_cpu_ms"] is None


@pytest.mark.parametrize(("largest", "met"), [(2.6, "yes"), (2.7, "no")])
def test_the_table_says_whether_the_added_p50_met_1_3x(largest: float, met: str) -> None:
    rows = [row(10, 2.0, live=True), row(10_000, largest, live=True)]
    result = {"rows": rows, "ratio_last_first": ratios(rows, 0), "summaries": {"ok": 4.0}}
    table = flat_cost_table(result)
    assert f"(target ≤ 1.3x: {met})" in table
    assert "| 40 → 35 |" in table  # the jobs pending at load and at the end, live
