"""``memory-gateway import --from chatgpt|claude``: a service's data export into sessions of
a user, against a real gateway; recalled afterwards with the dates it was said."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devsupport.servers import ServerThread
from gateway.commands.checkpoint import Checkpoint
from gateway.commands.import_exports import read_export_file
from gateway.commands.transcript import Entry, MessagesDigest
from tests.system.test_cli import GATEWAY, Run, stored

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exports"
LISBON = "chatgpt-0c6f3a52-1b7e-4d0a-9a11-5f2e8c3d4a01"
SOURDOUGH = "chatgpt-7d2b9e40-58c1-4f3e-b0d2-2a9c6e1f7b02"
GARDEN = "claude-3f9a1c2e-6b4d-4e8f-a0b1-c2d3e4f5a601"
BIKE = "claude-8c7b6a59-4d3e-4f21-9a8b-7c6d5e4f3a02"


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "240")
    for name in ("MEMORY_GATEWAY_URL", "MEMORY_GATEWAY_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def run(gateway: ServerThread, api_key: str, capsys: pytest.CaptureFixture[str]) -> Run:
    return Run(gateway, api_key, capsys)


@pytest.fixture
def api(gateway: ServerThread, api_key: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=gateway.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    ) as client:
        yield client


def copied(tmp_path: Path, fmt: str) -> Path:
    """The fixture beside the test's files (the checkpoint is written next to it)."""
    path = tmp_path / f"{fmt}-conversations.json"
    shutil.copy(FIXTURES / path.name, path)
    return path


def search(api: httpx.Client, user: str, query: str) -> list[dict[str, Any]]:
    response = api.post(f"/memory/users/{user}/search", json={"query": query})
    assert response.status_code == 200, response.text
    results: list[dict[str, Any]] = response.json()["results"]
    return results


def test_a_chatgpt_export_becomes_recallable_sessions_of_the_user_with_their_dates(
    run: Run, api: httpx.Client, tmp_path: Path
) -> None:
    path = copied(tmp_path, "chatgpt")
    code, out, err = run("import", "--from", "chatgpt", str(path), "--user", "ada")
    assert code == 0, err
    assert f"imported 2 conversations from {path} into sessions of user ada (8 messages)" in out
    assert f"  {LISBON}  4 messages, 2024-05-02 to 2024-05-03  Lisbon trip planning" in out
    assert "skipped 1 conversation with nothing to import" in out
    # The progress shown (its last state: stderr is no terminal here): the conversations
    # done of the export's, and the last conversation's messages.
    lines = err.splitlines()
    assert lines[0].startswith("conversations") and lines[0].split()[-3] == "2/2", err
    assert lines[1].startswith('conversation 2 "Sourdough starter"') and " 4/4 messages " in err
    assert not (tmp_path / "chatgpt-conversations.json.import-progress.json").exists()

    assert sorted(api.get("/memory/users/ada").json()["sessions"]) == [LISBON, SOURDOUGH]
    lisbon = stored(api, LISBON, keep=("timestamp",))
    assert [(m["role"], m["timestamp"]) for m in lisbon] == [
        ("user", "2024-05-02T09:15:00Z"), ("assistant", "2024-05-02T09:15:20Z"),
        ("user", "2024-05-03T18:39:00Z"), ("assistant", "2024-05-03T18:40:00Z"),
    ]  # fmt: skip
    assert lisbon[2]["content"] == "Which neighbourhood is quiet at night but close to the trams?"
    sourdough = stored(api, SOURDOUGH)
    assert sourdough[0]["content"].startswith("[image]\nThis is my rye starter")
    assert "It looks ready." not in json.dumps(sourdough)  # the answer regenerated away

    found = search(api, "ada", "Which seat do I have on the Lisbon flight?")
    seat = next(r for r in found if "14C" in r["text"])
    assert seat["session_id"] == LISBON and seat["date"].startswith("2024-05-02")


def test_a_claude_export_becomes_recallable_sessions_of_the_user_with_their_dates(
    run: Run, api: httpx.Client, tmp_path: Path
) -> None:
    path = copied(tmp_path, "claude")
    code, out, err = run("import", "--from", "claude", str(path), "--user", "ada")
    assert code == 0, err
    assert f"imported 2 conversations from {path} into sessions of user ada (6 messages)" in out
    assert f"  {GARDEN}  4 messages, 2024-06-03 to 2024-06-05  Tomato beds" in out
    garden = stored(api, GARDEN, keep=("timestamp",))
    assert [m["timestamp"][:19] for m in garden] == [
        "2024-06-03T17:02:12", "2024-06-03T17:02:30", "2024-06-05T07:45:00", "2024-06-05T07:45:30",
    ]  # fmt: skip
    assert stored(api, BIKE)[0]["content"].endswith("[attachment: receipt.txt]")

    found = search(api, "ada", "what was wrong with the tomato leaves?")
    blight = next(r for r in found if "early blight" in r["text"])
    assert blight["session_id"] == GARDEN and blight["date"].startswith("2024-06-05")

    # Run again: nothing is imported twice.
    code, out, err = run("import", "--from", "claude", str(path), "--user", "ada")
    assert code == 0, err
    assert "imported 0 conversations" in out and "skipped 2 conversations imported before" in out
    assert len(stored(api, GARDEN)) == 4 and len(stored(api, BIKE)) == 2

    # For another user: the sessions are ada's, and said to be, not "imported before".
    code, out, err = run("import", "--from", "claude", str(path), "--user", "bob")
    assert code == 0, err
    assert "imported 0 conversations" in out and "imported before" not in out
    assert (
        f'note: conversation 1 "Tomato beds" (session {GARDEN}) was imported for user ada, '
        "not bob: left as it is"
    ) in err
    assert api.get("/memory/users/bob").status_code == 404
    assert api.get(f"/memory/sessions/{GARDEN}").json()["user_id"] == "ada"


def test_usage_errors(run: Run, tmp_path: Path) -> None:
    path = copied(tmp_path, "claude")
    code, _, err = run("import", "--from", "claude", str(path))
    assert code == 2 and "--from claude needs --user" in err
    code, _, err = run("import", "--from", "claude", str(path), "--user", "u", "--session", "s")
    assert code == 2 and "leave out --session" in err
    code, _, err = run("import", str(path))
    assert code == 2 and "--session is needed" in err
    code, _, err = run("import", "--from", "chatgpt", str(path), "--user", "u")
    assert code == 2
    assert err == (
        f'{path}: conversation 1: "mapping" must be an object, not null: is this a Claude export?\n'
    )


@pytest.mark.parametrize("landed", [True, False], ids=["batch landed", "batch lost"])
def test_an_interrupted_export_import_resumes_where_it_stopped(
    landed: bool, run: Run, api: httpx.Client, tmp_path: Path
) -> None:
    path = copied(tmp_path, "chatgpt")
    export = read_export_file(path, "chatgpt")
    lisbon, sourdough, _ = export.conversations
    headers = {"X-User-Id": "ada"}
    # The first conversation was imported, the second was cut short while its second
    # batch of 2 was on its way: it reached the gateway or not.
    for sid, messages in ((LISBON, lisbon.messages), (SOURDOUGH, sourdough.messages[:2])):
        body = {"messages": list(messages)}
        assert api.post(f"/memory/sessions/{sid}/messages", json=body, headers=headers).is_success
    if landed:
        body = {"messages": list(sourdough.messages[2:4])}
        api.post(f"/memory/sessions/{SOURDOUGH}/messages", json=body, headers=headers)
    entries = [Entry(i, m) for i, m in enumerate(sourdough.messages, 1)]
    Checkpoint(
        session=SOURDOUGH, file=str(path), file_sha256=export.sha256, done=2,
        done_sha256=MessagesDigest(entries[:2]).hexdigest(), message_count=2, sending=2,
    ).save(tmp_path / "chatgpt-conversations.json.import-progress.json")  # fmt: skip

    code, out, err = run("import", "--from", "chatgpt", str(path), "--user", "ada", "--batch", "2")
    assert code == 0, err
    sent = 0 if landed else 2
    assert f"imported 1 conversation from {path} into sessions of user ada ({sent} " in out
    assert "1 of them resumed" in out and "skipped 1 conversation imported before" in out
    assert [m["content"] for m in stored(api, SOURDOUGH)] == [
        m["content"] for m in sourdough.messages
    ]
    assert len(stored(api, LISBON)) == 4


def many_conversations(n: int) -> list[dict[str, Any]]:
    """A Claude export of n conversations of 6 messages each."""
    return [
        {
            "uuid": f"conv-{c:03d}",
            "name": f"conversation {c}",
            "created_at": "2024-06-01T10:00:00Z",
            "chat_messages": [
                {"sender": "human" if i % 2 == 0 else "assistant", "text": f"message {i} of {c}",
                 "created_at": f"2024-06-01T10:{i:02d}:00Z"}
                for i in range(6)
            ],
        }
        for c in range(n)
    ]  # fmt: skip


def test_ctrl_c_mid_export_import_then_the_same_command_finishes_it(
    gateway: ServerThread, api_key: str, api: httpx.Client, tmp_path: Path
) -> None:
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(many_conversations(40)))
    state = tmp_path / "conversations.json.import-progress.json"
    command = [
        *GATEWAY, "import", "--from", "claude", str(path), "--user", "bo", "--batch", "1",
        "--url", gateway.url,
    ]  # fmt: skip
    env = {**os.environ, "MEMORY_GATEWAY_API_KEY": api_key}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the import made no progress"
            # Frozen while its progress is read and the signal sent (as the file import's
            # test does): into its fourth conversation, part of it sent.
            process.send_signal(signal.SIGSTOP)
            if state.exists():
                mark = json.loads(state.read_text())
                if mark["session"] >= "claude-conv-003" and mark["done"] >= 2:
                    break
            process.send_signal(signal.SIGCONT)
            time.sleep(0.005)
        process.send_signal(signal.SIGINT)
        process.send_signal(signal.SIGCONT)
        _, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert "interrupted: " in err and "Run the same command again to resume" in err
    cut = json.loads(state.read_text())["session"]
    assert 2 <= len(stored(api, cut)) < 6

    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr
    assert "1 of them resumed" in rerun.stdout and "imported before" in rerun.stdout
    sessions = api.get("/memory/users/bo").json()["sessions"]
    assert len(sessions) == 40
    for c in range(40):  # each message exactly once, in order
        contents = [m["content"] for m in stored(api, f"claude-conv-{c:03d}")]
        assert contents == [f"message {i} of {c}" for i in range(6)]
    assert not state.exists()
