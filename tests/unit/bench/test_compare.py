"""bench/compare.py: two REALTALK reports compared question by question."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import compare


def result(conversation: str, number: int, category: str, budget: int, share: float):
    return {
        "conversation": conversation,
        "number": number,
        "category": category,
        "budget": budget,
        "share": share,
    }


def report(rows: dict[str, list[dict[str, Any]]], commit: str = "abc") -> dict[str, Any]:
    return {
        "commit": commit,
        "settings": {"dataset": "realtalk"},
        "rows": [{"name": n, "results": r} for n, r in rows.items()],
    }


BEFORE = report({
    "hybrid-recall": [
        result("Chat_1", 0, "multi-hop", 1500, 0.5),
        result("Chat_1", 1, "temporal", 1500, 1.0),
        result("Chat_2", 0, "multi-hop", 1500, 0.0),
        result("Chat_2", 1, "commonsense", 1500, 1.0),
        result("Chat_2", 2, "commonsense", 1500, 0.5),  # not asked after
        result("Chat_1", 0, "multi-hop", 3000, 1.0),
    ],
    "gone": [result("Chat_1", 0, "multi-hop", 1500, 0.0)],
})  # fmt: skip
AFTER = report({
    "hybrid-recall": [
        result("Chat_1", 0, "multi-hop", 1500, 1.0),  # +0.5
        result("Chat_1", 1, "temporal", 1500, 1.0),  # unchanged
        result("Chat_2", 0, "multi-hop", 1500, 0.25),  # +0.25
        result("Chat_2", 1, "commonsense", 1500, 0.0),  # -1.0
        result("Chat_3", 0, "temporal", 1500, 1.0),  # not asked before
        result("Chat_1", 0, "multi-hop", 3000, 1.0),
    ],
    "new": [result("Chat_1", 0, "multi-hop", 1500, 1.0)],
})  # fmt: skip


def test_each_row_and_budget_both_reports_hold_is_compared_over_the_questions_both_asked():
    changes = compare.compare(BEFORE, AFTER)

    assert [(c.row, c.budget) for c in changes] == [
        ("hybrid-recall", 1500),
        ("hybrid-recall", 3000),
    ]
    at_1500, at_3000 = changes
    assert at_1500.questions == 4
    assert (at_1500.better, at_1500.worse) == (2, 1)
    assert at_1500.points == pytest.approx(100 * (0.5 + 0.25 - 1.0) / 4)
    assert at_1500.by_category == pytest.approx(
        {"commonsense": -100.0, "multi-hop": 37.5, "temporal": 0.0}
    )
    # Chat_1 gained 0.5; Chat_2 gained 0.25 and lost 1.0.
    assert (at_1500.conversations_better, at_1500.conversations_worse) == (1, 1)
    assert at_1500.p_value == pytest.approx(1.0)  # 2 against 1: a coin does as well
    assert (at_3000.questions, at_3000.better, at_3000.worse, at_3000.points) == (1, 0, 0, 0.0)


@pytest.mark.parametrize(
    ("better", "worse", "expected"),
    [
        (0, 0, 1.0),
        (5, 5, 1.0),
        (10, 0, 2 / 1024),  # all ten one way: 2 of 1,024 splits are as uneven
        (0, 10, 2 / 1024),
        (7, 3, 2 * (1 + 10 + 45 + 120) / 1024),
        (20, 5, 0.0041),
    ],
)
def test_the_sign_test_is_two_sided_over_the_questions_that_moved(better, worse, expected):
    assert compare.sign_test(better, worse) == pytest.approx(expected, abs=1e-4)


def test_the_table_has_a_line_per_row_and_budget_with_what_moved():
    table = compare.format_changes(compare.compare(BEFORE, AFTER))
    lines = table.splitlines()

    assert lines[0].split()[:3] == ["row", "budget", "points"]
    assert "commonsense" in lines[0] and "multi-hop" in lines[0]
    assert len(lines) == 4  # the head, a rule, two rows
    assert lines[2].split()[:3] == ["hybrid-recall", "1500", "-6.2"]
    assert "2 / 1 of 4" in lines[2]
    assert lines[3].split()[:3] == ["hybrid-recall", "3000", "+0.0"]


def test_reports_with_nothing_in_common_say_so():
    assert compare.format_changes(compare.compare(BEFORE, report({}))) == (
        "no row and budget in common"
    )


def test_the_command_prints_the_table_and_refuses_a_file_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(BEFORE))
    after.write_text(json.dumps(AFTER))

    assert compare.main([str(before), str(after)]) == 0
    assert "2 / 1 of 4" in capsys.readouterr().out

    after.write_text("{not json")
    assert compare.main([str(before), str(after)]) == 2
    assert "compare:" in capsys.readouterr().err
    assert compare.main([str(before), str(tmp_path / "missing.json")]) == 2


@pytest.mark.parametrize(
    "other",
    [
        {"settings": {"dataset": "synthetic"}, "rows": [{"name": "hybrid", "results": [{}]}]},
        [],  # not a report
        {"settings": {"dataset": "realtalk"}, "rows": [{"name": "x", "results": [{"a": 1}]}]},
    ],
)
def test_what_is_not_a_realtalk_report_of_questions_is_refused_in_words(
    other: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    with pytest.raises(ValueError, match="report"):
        compare.compare(BEFORE, other)
    before, after = tmp_path / "before.json", tmp_path / "other.json"
    before.write_text(json.dumps(BEFORE))
    after.write_text(json.dumps(other))
    assert compare.main([str(before), str(after)]) == 2
    assert "compare:" in capsys.readouterr().err
