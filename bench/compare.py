"""Is a change to recall more than noise? Two REALTALK runs compared question by question.

A change to a ranking constant moves a few dozen of REALTALK's 704 questions, some up and
some down, and the mean by a few tenths of a point either way: as much as the change
under test often is. So the mean alone does not tell a change from noise. This compares
two ``bench/recall.py --dataset realtalk --json`` reports row by row and budget by budget:
how many questions found more of their evidence and how many less, in how many of the
conversations the row gained and lost, and a two-sided sign test over the questions that
moved (the chance of a split at least that uneven if each were a coin toss). Held-out
conversations reward a change that wins in most conversations and both budgets, not one
that wins the mean.

    .venv/bin/python bench/compare.py before.json after.json
    .venv/bin/python bench/recall.py --dataset realtalk --compare before.json

Pure: the reports in, the comparison and its table out.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A share that moved by less than this did not move (the reports round nothing, but a
# float sum may differ in its last bits).
_EPSILON = 1e-9

Key = tuple[str, int]  # (conversation, the question's place in its file)


@dataclass(frozen=True)
class Change:
    """One row at one budget, after against before, over the questions both asked."""

    row: str
    budget: int
    questions: int
    better: int  # questions that found more of their evidence
    worse: int
    points: float  # the mean share's change, in points
    by_category: dict[str, float]  # each category's change, in points
    conversations_better: int  # conversations whose questions gained, summed
    conversations_worse: int
    p_value: float  # two-sided sign test over the questions that moved


def sign_test(better: int, worse: int) -> float:
    """Two-sided: the chance that ``better + worse`` fair coin tosses split at least as
    unevenly as they did (1.0 when nothing moved)."""
    moved = better + worse
    if moved == 0:
        return 1.0
    fewer = min(better, worse)
    tail = sum(math.comb(moved, k) for k in range(fewer + 1)) / 2**moved
    return min(1.0, 2 * tail)


def shares(report: Any) -> dict[tuple[str, int], dict[Key, tuple[str, float]]]:
    """Each (row, budget)'s questions: their category and evidence share. Raises
    ValueError for what is not a ``--dataset realtalk`` report."""
    if not isinstance(report, dict) or report.get("settings", {}).get("dataset") != "realtalk":
        raise ValueError("not a bench/recall.py --dataset realtalk --json report")
    found: dict[tuple[str, int], dict[Key, tuple[str, float]]] = defaultdict(dict)
    try:
        for row in report.get("rows", ()):
            for result in row.get("results", ()):
                key = (result["conversation"], int(result["number"]))
                found[(row["name"], int(result["budget"]))][key] = (
                    result["category"],
                    float(result["share"]),
                )
    except (AttributeError, KeyError, TypeError) as error:
        raise ValueError(f"a REALTALK report without its questions' results ({error!r})") from error
    return dict(found)


def compare(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Change]:
    """Every row and budget of both reports, in the order of ``after``; questions only
    one of them asked are left out."""
    old, new = shares(before), shares(after)
    return [
        _change(row, budget, old[(row, budget)], questions)
        for (row, budget), questions in new.items()
        if (row, budget) in old
    ]


def _change(
    row: str,
    budget: int,
    old: Mapping[Key, tuple[str, float]],
    new: Mapping[Key, tuple[str, float]],
) -> Change:
    both = [key for key in new if key in old]
    deltas = {key: new[key][1] - old[key][1] for key in both}
    by_conversation: dict[str, float] = defaultdict(float)
    by_category: dict[str, list[float]] = defaultdict(list)
    for key, delta in deltas.items():
        by_conversation[key[0]] += delta
        by_category[new[key][0]].append(delta)
    better = sum(1 for d in deltas.values() if d > _EPSILON)
    worse = sum(1 for d in deltas.values() if d < -_EPSILON)
    return Change(
        row=row,
        budget=budget,
        questions=len(both),
        better=better,
        worse=worse,
        points=100 * _mean(deltas.values()),
        by_category={c: 100 * _mean(ds) for c, ds in sorted(by_category.items())},
        conversations_better=sum(1 for d in by_conversation.values() if d > _EPSILON),
        conversations_worse=sum(1 for d in by_conversation.values() if d < -_EPSILON),
        p_value=sign_test(better, worse),
    )


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def format_changes(changes: Sequence[Change]) -> str:
    """The comparison as a table, a line per row and budget."""
    if not changes:
        return "no row and budget in common"
    categories = sorted({c for change in changes for c in change.by_category})
    head = ["row", "budget", "points", *categories, "questions +/-", "conversations +/-", "p"]
    lines = [
        [
            change.row,
            str(change.budget),
            f"{change.points:+.1f}",
            *(f"{change.by_category.get(c, 0.0):+.1f}" for c in categories),
            f"{change.better} / {change.worse} of {change.questions}",
            f"{change.conversations_better} / {change.conversations_worse}",
            f"{change.p_value:.2f}",
        ]
        for change in changes
    ]
    widths = [max(len(cells[i]) for cells in (head, *lines)) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )

    rule = "-" * len(line(head))
    return "\n".join([line(head), rule, *(line(cells) for cells in lines)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="an earlier --json report")
    parser.add_argument("after", type=Path, help="a later one")
    args = parser.parse_args(argv)
    try:
        before, after = (json.loads(path.read_text()) for path in (args.before, args.after))
        changes = compare(before, after)
    except (OSError, ValueError) as error:
        print(f"compare: {error}", file=sys.stderr)
        return 2
    print(format_changes(changes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
