"""bench/answers.py end to end: a tiny REALTALK conversation imported into a real gateway
(its own process, embedded Redis), every question answered through it and by the full
history, graded by a judge; the model and the judge are one stub HTTP server here.

The stub answers a question with the text of every message it was sent but the
question (what it was given to answer from), and judges CORRECT when the gold answer is
in the answer: J is then the share of questions whose answer was in what reached the
model, which this test knows in advance.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from devsupport.servers import free_port
from tests.support.tiny_realtalk import CONVERSATION, VERDICTS, write_dataset

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-answers-test-key-5f0c2e"
JUDGE = "stub-judge"
GATEWAY_ROW = "gateway hybrid-recall @ 3000"


class Stub:
    """An OpenAI-compatible server in a thread: the answering model and the judge."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.keys: set[str] = set()
        self.judge_failures = 0  # the next N judge calls answer 503
        self.max_words: int | None = None  # a longer prompt is refused as too long
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        messages = body["messages"]
        if body["model"] == JUDGE:
            with self.lock:
                self.calls["judge"] += 1
                if self.judge_failures:
                    self.judge_failures -= 1
                    return 503, {"error": {"message": "judge busy"}}
            prompt = messages[0]["content"]
            # The last "Gold answer:": the prompt's example has one too.
            found = re.search(
                r".*Gold answer: (.*?)\nGenerated answer: (.*)\n\nFirst", prompt, re.S
            )
            assert found, prompt
            gold, answer = found.groups()
            # Both forms parse_verdict reads: the JSON label, and prose ending with WRONG.
            text = '{"label": "CORRECT"}' if gold.lower() in answer.lower() else "No.\nWRONG"
            return 200, completion(text, 50)
        with self.lock:
            self.calls["answer"] += 1
        context = "\n".join(str(m["content"]) for m in messages[:-1])
        words = len(context.split())
        if self.max_words is not None and words > self.max_words:
            error = f"This model's maximum context length is {self.max_words} tokens"
            return 400, {"error": {"message": error}}
        return 200, completion(context, words)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send(200 if self.path == "/v1/models" else 404, {"data": [{"id": "stub"}]})

            def do_POST(self) -> None:
                stub.keys.add(self.headers.get("authorization", ""))
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                self.send(*stub.reply(body))

            def send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def completion(text: str, prompt_tokens: int) -> dict[str, Any]:
    return {
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 7},
    }


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = Stub()
    yield server
    server.server.shutdown()
    server.server.server_close()


def answers(data: Path, out: Path, model_url: str, *more: str, judge_url: str | None = None):
    command = [
        sys.executable, "bench/answers.py", "--data", str(data), "--out", str(out),
        "--model-url", model_url, "--model", "stub", "--judge-model", JUDGE,
        "--judge-url", judge_url or model_url, "--judge-key-env", "ANSWERS_MODEL_KEY",
        "--concurrency", "2", *more,
    ]  # fmt: skip
    env = {**os.environ, "ANSWERS_MODEL_KEY": SECRET}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def states(out: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Each (row, question)'s last line in the --out file."""
    found = {}
    for line in out.read_text().splitlines():
        item = json.loads(line)
        if "row" in item:
            found[(item["row"], item["number"])] = item
    return found


def test_j_is_what_the_judge_said_and_a_rerun_does_only_what_is_missing(
    tmp_path: Path, stub: Stub
) -> None:
    data, out = write_dataset(tmp_path / "realtalk"), tmp_path / "answers.jsonl"
    stub.judge_failures = 1  # one grade is left to the next run
    first = answers(data, out, stub.url, "--questions-per-conversation", "2")
    assert first.returncode == 1, first.stderr
    assert "1 question(s) not answered or graded yet" in first.stderr
    assert stub.calls == {"answer": 4, "judge": 4}  # two questions, two rows

    second = answers(data, out, stub.url, "--questions-per-conversation", "3")
    assert second.returncode == 0, second.stderr
    # The two new questions answered and graded, the grade that failed asked again.
    assert stub.calls == {"answer": 6, "judge": 7}

    records = states(out)
    assert sorted(records) == [(row, n) for row in ("full history", GATEWAY_ROW) for n in (0, 1, 2)]
    for (row, number), record in records.items():
        assert record["verdict"] == VERDICTS[number], (row, record)
        assert (CONVERSATION["qa"][number][1] in record["answer"]) is (
            VERDICTS[number] == "CORRECT"
        )
        assert record["forwarded_tokens"] > 0
        assert record["prompt_tokens"] > 0  # the stub's usage
    assert records[(GATEWAY_ROW, 0)]["memory_status"] == "ok"
    # The baseline sent the history with its days; the gateway its memory of it.
    assert "[Sat 2024-01-13] Hi Bob!" in records[("full history", 0)]["answer"]
    assert "Pixel" in records[(GATEWAY_ROW, 0)]["answer"]

    table = second.stdout
    assert "commit " in table.splitlines()[0]
    for row in (GATEWAY_ROW, "full history"):
        assert re.search(rf"\| {row} \| all \| 66\.7% \| 3 \| 0 \| 0 \| 0 \| [\d,]+ \| \$", table)
        assert f"| {row} | temporal | 0.0% | 1 |" in table
        assert f"| {row} | multi-hop | 100.0% | 1 |" in table
        assert f"| {row} | commonsense | 100.0% | 1 |" in table
    assert "full history: sent whole for every question" in table

    third = answers(data, out, stub.url, "--questions-per-conversation", "3")
    assert third.returncode == 0, third.stderr
    assert stub.calls == {"answer": 6, "judge": 7}  # nothing left to do
    assert third.stdout.split("\n", 1)[1] == second.stdout.split("\n", 1)[1]

    # The key reached the model (through the gateway too) and was written nowhere.
    assert stub.keys == {f"Bearer {SECRET}"}
    for text in (first.stdout, first.stderr, second.stdout, second.stderr, out.read_text()):
        assert SECRET not in text


def test_the_baseline_is_cut_from_the_front_until_the_model_takes_it(
    tmp_path: Path, stub: Stub
) -> None:
    data, out = write_dataset(tmp_path / "realtalk"), tmp_path / "answers.jsonl"
    stub.max_words = 90  # fewer than the whole history's words, more than the question's
    done = answers(data, out, stub.url, "--questions-per-conversation", "1")
    baseline = states(out)[("full history", 0)]
    assert baseline["answer"] is not None, baseline
    assert baseline["truncated"] > 0
    assert "Hi Bob!" not in baseline["answer"]  # the oldest message went first
    assert "Of course she does." in baseline["answer"]  # the newest stayed
    assert "| full history (front-cut for 1 of 1) | all |" in done.stdout
    assert "full history: the oldest messages dropped to fit" in done.stdout


def test_a_model_or_judge_server_that_is_not_there_is_one_line_and_exit_2(
    tmp_path: Path, stub: Stub
) -> None:
    data, out = write_dataset(tmp_path / "realtalk"), tmp_path / "answers.jsonl"
    nowhere = f"http://127.0.0.1:{free_port()}/v1"
    for model_url, judge_url, who in ((nowhere, stub.url, "the answering model's server"),
                                      (stub.url, nowhere, "the judge's server")):  # fmt: skip
        done = answers(data, out, model_url, judge_url=judge_url)
        assert done.returncode == 2
        assert done.stdout == ""
        assert done.stderr.count("\n") == 1
        assert done.stderr.startswith(f"answers: {who} at {nowhere} is unreachable (Connect")
    assert stub.calls == {}
    assert not out.exists()


def test_records_made_with_another_judge_are_not_resumed(tmp_path: Path, stub: Stub) -> None:
    data, out = write_dataset(tmp_path / "realtalk"), tmp_path / "answers.jsonl"
    out.write_text(json.dumps({"run": {"model": "stub", "judge_model": "gpt-4o",
                                       "preset": "hybrid-recall"}}) + "\n")  # fmt: skip
    done = answers(data, out, stub.url)
    assert done.returncode == 2
    assert "judge_model 'gpt-4o' -> 'stub-judge'" in done.stderr
    assert stub.calls == {}
