"""The Vercel AI SDK's default OpenAI provider through the gateway (issue 34): the
Responses API with ``store: true``, the history resent every turn with earlier answers
as ``item_reference`` items. The real SDK (tests/node, installed by scripts/test) drives
the gateway from a Node process; the fake upstream keeps its output items as OpenAI does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess, ServerThread
from devsupport.stored import stored_log
from gateway.memory.model import content_text
from tests.support.clients import register_content

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
QUESTIONS = [
    "my favourite colour is teal",
    "my cat is called Miso",
    "what is my favourite colour?",
    "my car is blue",
]
ANSWERS = [
    "ack: my favourite colour is teal",
    "ack: my cat is called Miso",
    "Your favourite colour is teal.",
    "ack: my car is blue",
]


def node() -> str:
    """Node, with the SDK installed; missing ones fail, never skip."""
    path = shutil.which("node")
    assert path, "no node: install Node 20+ (apt-get install nodejs npm), then scripts/test"
    assert (NODE_DIR / "node_modules" / "ai").is_dir(), (
        "the AI SDK is not installed: npm ci --prefix tests/node (scripts/test does)"
    )
    return path


def converse(
    gateway: ServerThread,
    key: str,
    session: str,
    mode: str,
    questions: list[str],
    models: list[str] | None = None,
    timeout_s: float = 60,
    **more: Any,
) -> dict[str, Any]:
    """A conversation of an app built on the SDK (``tests/node/vercel_turns.mjs``), a
    turn a question, each of fake-model unless ``models`` says (``more``: the script's
    other fields)."""
    for question in questions:
        register_content(question)
    request = {
        "baseURL": gateway.url + "/v1",
        "apiKey": key,
        "session": session,
        "models": models or ["fake-model"] * len(questions),
        "mode": mode,
        "questions": questions,
        **more,
    }
    done = subprocess.run(
        [node(), str(NODE_DIR / "vercel_turns.mjs")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.mark.parametrize("mode", ["generate", "stream", "ui"])
def test_a_resent_history_of_item_references_is_stored_once(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    mode: str,
) -> None:
    said = converse(gateway, api_key, session_id, mode, QUESTIONS)
    # The SDK did send earlier answers as references: 0 + 1 + 2 + 3 of them.
    assert said["references"] == 6, said["inputs"]
    # The third answer needed the first turn: the context held it.
    assert said["answers"] == ANSWERS
    # Two messages a turn, each once, in order (before: 13 after 4 turns).
    log = stored_log(redis_server, api_key, session_id)
    expected = [m for pair in zip(QUESTIONS, ANSWERS, strict=True) for m in pair]
    assert [content_text(m["content"]) for m in log] == expected
    assert [m["role"] for m in log] == ["user", "assistant"] * 4
    # Upstream, each turn's input holds each question once and no reference: memory's
    # copies of the answers stand in for them.
    forwarded = [r.json()["input"] for r in fake_upstream.responses_requests()]
    assert len(forwarded) == 4
    for turn, items in enumerate(forwarded):
        assert all(item.get("type") == "message" for item in items)
        texts = [part["text"] for item in items for part in item["content"]]
        assert [t for t in texts if t in QUESTIONS] == QUESTIONS[: turn + 1]
        assert texts == expected[: 2 * turn + 1]


@pytest.mark.parametrize("mode", ["generate", "ui"])
def test_a_turn_with_a_function_call_lines_up(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    mode: str,
) -> None:
    # The app runs get_weather for tool-caller's call (two requests: the call, then the
    # answer from its result); the SDK sends calls whole and answers' text by reference.
    questions = ["weather in Paris?", *QUESTIONS[:1], QUESTIONS[2]]
    models = ["tool-caller", "fake-model", "fake-model"]
    said = converse(gateway, api_key, session_id, mode, questions, models)
    assert said["references"] == 3, said["inputs"]
    assert said["answers"] == ["The tool said: sunny in Paris", ANSWERS[0], ANSWERS[2]]
    log = stored_log(redis_server, api_key, session_id)
    roles = ["user", "assistant", "tool", "assistant"] + ["user", "assistant"] * 2
    assert [m["role"] for m in log] == roles
    assert log[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert [content_text(m["content"]) for m in log[3:]] == [
        "The tool said: sunny in Paris", *QUESTIONS[:1], ANSWERS[0], QUESTIONS[2], ANSWERS[2]
    ]  # fmt: skip
    # The last request upstream: every stored message once, no reference.
    items = fake_upstream.responses_requests()[-1].json()["input"]
    assert [i["type"] for i in items] == [
        "message", "function_call", "function_call_output", "message", "message", "message",
        "message",
    ]  # fmt: skip
