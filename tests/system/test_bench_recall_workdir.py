"""bench/recall.py --dataset realtalk with --workdir and --compare, end to end: a tiny
REALTALK conversation imported into a real gateway (its own process, embedded Redis) once,
asked again from the kept import by a second run, and the two runs compared."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.tiny_realtalk import write_dataset

ROOT = Path(__file__).resolve().parents[2]
IMPORTED = "hybrid-recall: Chat_1_Ann_Bob imported (1/1)"
REUSED = "hybrid-recall: the conversations as imported in"


@pytest.fixture
def workdir() -> Iterator[Path]:
    """Short: the embedded Redis's unix socket lies in it, and a socket's path has at most
    ~100 characters (pytest's ``tmp_path`` under xdist comes close)."""
    with tempfile.TemporaryDirectory(prefix="rw-") as short:
        yield Path(short) / "work"


def recall_bench(data: Path, workdir: Path, *more: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "bench/recall.py", "--dataset", "realtalk", "--data", str(data),
        "--presets", "hybrid-recall", "--budgets", "400", "--workdir", str(workdir), *more,
    ]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def shares(report: Path) -> dict[tuple[str, int], float]:
    (row,) = [r for r in json.loads(report.read_text())["rows"] if r["name"] == "hybrid-recall"]
    return {(r["conversation"], r["number"]): r["share"] for r in row["results"]}


def test_a_kept_import_is_asked_again_and_compared_and_another_one_is_replaced(
    tmp_path: Path, workdir: Path
) -> None:
    data = write_dataset(tmp_path / "data")
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    # What an import cut short left (Redis data, no marker): imported again from nothing,
    # not on top of it; what the bench did not make is left alone.
    kept = workdir / "hybrid-recall"
    (kept / "redis").mkdir(parents=True)
    (kept / "redis" / "appendonly.aof").write_text("half an import")
    (kept / "notes.txt").write_text("the user's")

    run = recall_bench(data, workdir, "--json", str(first))
    assert run.returncode == 0, run.stderr
    assert IMPORTED in run.stderr and REUSED not in run.stderr
    assert "half an import" not in (kept / "redis" / "appendonly.aof").read_text(errors="replace")
    assert (kept / "notes.txt").read_text() == "the user's"
    assert (kept / "imported").read_text().startswith("Chat_1_Ann_Bob\n")

    again = recall_bench(data, workdir, "--json", str(second), "--compare", str(first))
    assert again.returncode == 0, again.stderr
    assert REUSED in again.stderr and IMPORTED not in again.stderr
    assert shares(second) == shares(first)  # the same import, asked the same
    assert len(shares(first)) == 3
    compared = again.stdout.split(f"against {first}")[1].splitlines()
    (line,) = [x for x in compared if x.startswith("hybrid-recall")]
    assert line.split()[1:3] == ["400", "+0.0"]
    assert "0 / 0 of 3" in line


def test_compare_and_workdir_are_refused_where_they_mean_nothing(tmp_path: Path) -> None:
    synthetic = subprocess.run(
        [sys.executable, "bench/recall.py", "--workdir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert synthetic.returncode == 2
    assert "--compare and --workdir: realtalk only" in synthetic.stderr

    missing = recall_bench(tmp_path, tmp_path / "work", "--compare", str(tmp_path / "no.json"))
    assert missing.returncode == 2
    assert "--compare: [Errno 2] No such file" in missing.stderr

    other = tmp_path / "synthetic.json"  # a report of the other dataset: no questions
    other.write_text(json.dumps({"settings": {"dataset": "synthetic"}, "rows": []}))
    refused = recall_bench(tmp_path, tmp_path / "work", "--compare", str(other))
    assert refused.returncode == 2
    assert "--compare: not a bench/recall.py --dataset realtalk --json report" in refused.stderr
