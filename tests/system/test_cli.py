"""The operator commands (import, export, inspect, sessions) against a real gateway.

They run in-process (``gateway.cli.main`` with captured output), or as a process where
the process matters (an import interrupted by SIGINT).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from devsupport.servers import ServerThread, free_port
from gateway.cli import main
from gateway.commands.checkpoint import Checkpoint
from gateway.commands.transcript import MessagesDigest, read_transcript
from tests.support.clients import Memory, register_content, say, sdk
from tests.support.clock import SteppedClock
from tests.support.fixtures import GatewayFactory

GATEWAY = [sys.executable, "-m", "gateway.cli"]


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wide tables, and no gateway or key from the developer's own environment."""
    monkeypatch.setenv("COLUMNS", "240")
    for name in ("MEMORY_GATEWAY_URL", "MEMORY_GATEWAY_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


class Run:
    """``memory-gateway`` in this process, pointed at one gateway with one key."""

    def __init__(self, gateway: ServerThread, key: str, capsys: pytest.CaptureFixture[str]):
        self.connection = ["--url", gateway.url, "--api-key", key]
        self.key = key
        self.capsys = capsys

    def __call__(self, command: str, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main([command, *self.connection, *args])
        out, err = self.capsys.readouterr()
        assert self.key not in out + err  # the key is never printed
        return code, out, err


@pytest.fixture
def run(gateway: ServerThread, api_key: str, capsys: pytest.CaptureFixture[str]) -> Run:
    return Run(gateway, api_key, capsys)


@pytest.fixture
def api(gateway: ServerThread, api_key: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=gateway.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    ) as client:
        yield client


def conversation(n: int, tag: str = "") -> list[dict[str, Any]]:
    """n messages, user and assistant in turn, each saying which it is."""
    return [
        {
            "role": "user" if i % 2 else "assistant",
            "content": register_content(f"message {i} of the imported conversation {tag}"),
        }
        for i in range(1, n + 1)
    ]


def write_jsonl(path: Path, messages: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(m) + "\n" for m in messages))
    return path


def stored(api: httpx.Client, session: str, keep: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every message of the session, as its export gives them (index dropped, and the
    time it was said unless ``keep`` names it: here mostly the time of the import)."""
    response = api.get(f"/memory/sessions/{quote(session, safe='')}/export")
    assert response.status_code == 200, response.text
    dropped = {"index", "timestamp"} - set(keep)
    return [{k: v for k, v in m.items() if k not in dropped} for m in response.json()["messages"]]


def test_a_file_with_times_keeps_them_through_import_and_export(
    run: Run, api: httpx.Client, session_id: str, tmp_path: Path
) -> None:
    messages = conversation(4)
    messages[0]["timestamp"] = "2024-01-13T09:05:00Z"
    messages[1]["timestamp"] = 1705137000  # Unix seconds: 2024-01-13T09:10:00Z
    messages[2]["timestamp"] = "2024-01-14T10:00:00+02:00"
    path = tmp_path / "timed.json"
    path.write_text(json.dumps({"messages": messages}))
    code, _, err = run("import", str(path), "--session", session_id)
    assert code == 0, err
    times = [m.get("timestamp") for m in stored(api, session_id, keep=("timestamp",))]
    assert times[:3] == ["2024-01-13T09:05:00Z", "2024-01-13T09:10:00Z", "2024-01-14T08:00:00Z"]
    assert times[3] is not None  # no time given: the time of the import
    exported = api.get(f"/memory/sessions/{session_id}/export").text
    again = tmp_path / "again.json"
    again.write_text(exported)
    code, _, err = run("import", str(again), "--session", session_id + "-copy")
    assert code == 0, err
    copy = stored(api, session_id + "-copy", keep=("timestamp",))
    assert copy == stored(api, session_id, keep=("timestamp",))


def test_a_time_the_gateway_refuses_is_named_by_its_line(
    run: Run, api: httpx.Client, session_id: str, tmp_path: Path
) -> None:
    messages = conversation(3)
    messages[2]["timestamp"] = "yesterday"
    path = tmp_path / "bad-time.jsonl"
    path.write_text("\n".join(json.dumps(m) for m in messages) + "\n")
    code, _, err = run("import", str(path), "--session", session_id)
    assert code != 0
    assert "bad-time.jsonl:3: the gateway refused it: timestamp: must be Unix seconds" in err


def test_import_jsonl_then_the_session_has_exactly_its_messages(
    run: Run, api: httpx.Client, session_id: str, tmp_path: Path
) -> None:
    messages = conversation(7)
    messages[1:3] = [  # a tool call and its result, across a batch boundary (--batch 2)
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q": "seat"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "seat 14C"},
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(m) for m in messages[:4]) + "\n\n   \n")
    with path.open("a") as file:  # blank lines are skipped, CRLF is fine
        file.write("".join(json.dumps(m) + "\r\n" for m in messages[4:]))

    code, out, err = run("import", str(path), "--session", session_id, "--batch", "2")
    assert code == 0, err
    assert f"imported 7 messages from {path} into session {session_id}" in out
    assert f"session {session_id} now has 7 messages" in out
    assert stored(api, session_id) == messages
    state = api.get(f"/memory/sessions/{session_id}").json()
    assert state["message_count"] == 7
    assert not (tmp_path / "chat.jsonl.import-progress.json").exists()  # done: removed


def test_export_then_import_into_another_session_round_trips(
    run: Run, api: httpx.Client, session_id: str, tmp_path: Path
) -> None:
    messages = conversation(23)
    messages[4]["content"] = [{"type": "text", "text": "parts survive too: ünïcödé ✓"}]
    write_jsonl(tmp_path / "chat.jsonl", messages)
    assert run("import", str(tmp_path / "chat.jsonl"), "--session", session_id)[0] == 0

    exported = tmp_path / "export.json"
    code, _, err = run("export", session_id, "-o", str(exported))
    assert code == 0 and f"wrote session {session_id} to {exported}" in err
    assert [m["index"] for m in json.loads(exported.read_text())["messages"]] == list(range(1, 24))
    code, out, _ = run("export", session_id)  # to stdout: the same document
    assert code == 0 and json.loads(out) == json.loads(exported.read_text())

    copy = session_id + "-copy"
    code, out, err = run("import", str(exported), "--session", copy, "--batch", "10")
    assert code == 0, err
    assert f"session {copy} now has 23 messages" in out
    assert stored(api, copy) == stored(api, session_id) == messages

    code, out, _ = run("export", copy, "--format", "markdown")
    assert code == 0 and "parts survive too: ünïcödé ✓" in out


def test_transcript_document_skips_the_system_message_and_says_so(
    run: Run, api: httpx.Client, session_id: str, tmp_path: Path
) -> None:
    body = {
        "model": "gpt-4o-mini",
        "temperature": 0.2,
        "messages": [
            {"role": "system", "content": "You are a travel agent."},
            *conversation(4),
        ],
    }
    path = tmp_path / "request.json"
    path.write_text(json.dumps(body, indent=2))
    code, out, err = run("import", str(path), "--session", session_id)
    assert code == 0, err
    assert "skipping 1 system message (line 5)" in err  # where it starts in the file
    assert "skipped 1 system message" in out and "now has 4 messages" in out
    assert stored(api, session_id) == body["messages"][1:]


def test_an_array_document_is_a_transcript_too(
    run: Run, api: httpx.Client, session_id: str, tmp_path: Path
) -> None:
    messages = conversation(3)
    path = tmp_path / "transcript.json"
    path.write_text(json.dumps(messages))  # one line: still one document
    assert run("import", str(path), "--session", session_id)[0] == 0
    assert stored(api, session_id) == messages


JSONL_GOOD = [json.dumps(m) for m in conversation(3, "malformed")]
DOCUMENT_HEAD = '{\n  "model": "gpt-4o-mini",\n  "messages": [\n'  # the first message: line 4

MALFORMED = {
    "jsonl, bad JSON": (
        "\n".join([*JSONL_GOOD[:2], '{"role": "user", "content": "no end', JSONL_GOOD[2]]),
        3,
        "not valid JSON",
    ),
    "jsonl, no role": (
        "\n".join([JSONL_GOOD[0], '{"content": "who said this?"}', *JSONL_GOOD[1:]]),
        2,
        'message has no "role"',
    ),
    "jsonl, content a number": (
        "\n".join([*JSONL_GOOD, "", '{"role": "user", "content": 42}']),
        5,
        '"content" must be a string, an array of content parts, or null, not a number',
    ),
    "jsonl, unknown role": (
        "\n".join([JSONL_GOOD[0], '{"role": "narrator", "content": "x"}']),
        2,
        '"role" must be one of user, assistant, tool, system, developer, not "narrator"',
    ),
    "jsonl, a content part not an object": (
        "\n".join([JSONL_GOOD[0], '{"role": "user", "content": ["text"]}']),
        2,
        "content: content parts must be objects",
    ),
    "document, missing comma": (
        DOCUMENT_HEAD
        + "    "
        + JSONL_GOOD[0]
        + ",\n    "
        + JSONL_GOOD[1]
        + "\n    "
        + JSONL_GOOD[2]
        + "\n  ]\n}\n",
        6,
        "not valid JSON: expected ',' or ']' after a message",
    ),
    "document, bad JSON inside a message": (
        DOCUMENT_HEAD + "    " + JSONL_GOOD[0] + ',\n    {\n      "role": "user"\n'
        '      "content": "x"\n    }\n  ]\n}\n',
        7,
        "not valid JSON: Expecting ',' delimiter",
    ),
    "document, no role": (
        DOCUMENT_HEAD + "    " + JSONL_GOOD[0] + ",\n    " + JSONL_GOOD[1] + ",\n    {\n"
        '      "content": "who said this?"\n    }\n  ]\n}\n',
        6,
        'message has no "role"',
    ),
    "document, content an object": (
        "[\n  " + JSONL_GOOD[0] + ",\n\n  " + '{"role": "assistant", "content": {"a": 1}}' + "\n]",
        4,
        '"content" must be a string, an array of content parts, or null, not an object',
    ),
    "document, NaN": (
        "[\n  " + JSONL_GOOD[0] + ',\n  {"role": "user", "content": NaN}\n]',
        3,
        "not valid JSON: NaN is not valid JSON",
    ),
    "document, messages not an array": (
        '{\n  "model": "m",\n  "messages": {"role": "user"}\n}',
        3,
        '"messages" must be an array, not an object',
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_file_is_refused_naming_its_line(
    case: str, run: Run, api: httpx.Client, session_id: str, tmp_path: Path
) -> None:
    text, line, reason = MALFORMED[case]
    path = tmp_path / ("chat.json" if case.startswith("document") else "chat.jsonl")
    path.write_text(text)
    code, out, err = run("import", str(path), "--session", session_id)
    assert code == 2
    assert err.startswith(f"{path}:{line}: {reason}"), err
    assert out == ""
    assert api.get(f"/memory/sessions/{session_id}").status_code == 404  # nothing sent


def test_a_file_that_is_not_a_transcript(run: Run, session_id: str, tmp_path: Path) -> None:
    for text, expected in (
        ("", "the file is empty"),
        ('{\n  "model": "m"\n}\n', 'a JSON object with no "messages"'),
        ('[{"role": "system", "content": "only a prompt"}]', "no messages to import"),
    ):
        path = tmp_path / "odd.json"
        path.write_text(text)
        code, _, err = run("import", str(path), "--session", session_id)
        assert code == 2 and f"{path}: {expected}" in err, err
    path.write_bytes(b'{"role": "user", "content": "ok"}\n{"role": "user", "content": "\xff"}\n')
    code, _, err = run("import", str(path), "--session", session_id)
    assert code == 2 and err.startswith(f"{path}:2: not UTF-8 text")


def test_a_message_the_gateway_refuses_is_named_by_its_line_and_the_import_resumes_once_fixed(
    run: Run, api: httpx.Client, session_id: str, tmp_path: Path
) -> None:
    messages = conversation(8)
    # Line 6: a tool result answering no call. Only the gateway can tell (the log's tail
    # decides), and it names the message's place in its batch (lines 5-8).
    messages[5] = {"role": "tool", "tool_call_id": "call_9", "content": "orphan result"}
    path = write_jsonl(tmp_path / "chat.jsonl", messages)
    code, _, err = run("import", str(path), "--session", session_id, "--batch", "4")
    assert code == 2
    refusal = f"{path}:6: the gateway refused it: tool_call_id: 'call_9' answers no tool call"
    assert any(line.startswith(refusal) for line in err.splitlines()), err
    assert "the 4 messages before that batch are imported" in err
    assert len(stored(api, session_id)) == 4

    messages[5] = {"role": "assistant", "content": register_content("fixed line six, for sure")}
    write_jsonl(path, messages)  # another file now, but its first 4 messages are the same
    code, out, err = run("import", str(path), "--session", session_id, "--batch", "4")
    assert code == 0, err
    assert "resuming: 4 of 8 messages already imported" in err
    assert "imported 8 messages" in out and "4 of them by an earlier run" in out
    assert stored(api, session_id) == messages


def make_checkpoint(path: Path, session: str, done: int, count: int, sending: int) -> Path:
    """The checkpoint an import of ``path`` leaves when interrupted with ``done`` messages
    acknowledged and ``sending`` more sent (what the import itself writes)."""
    transcript = read_transcript(path)
    state = path.with_name(path.name + ".import-progress.json")
    Checkpoint(
        session=session,
        file=str(path.resolve()),
        file_sha256=transcript.sha256,
        done=done,
        done_sha256=MessagesDigest(transcript.entries[:done]).hexdigest(),
        message_count=count,
        sending=sending,
    ).save(state)
    return state


@pytest.mark.parametrize("landed", [True, False], ids=["batch landed", "batch lost"])
def test_resume_after_an_interruption_imports_each_message_once(
    landed: bool, run: Run, api: httpx.Client, session_id: str, tmp_path: Path
) -> None:
    messages = conversation(10)
    path = write_jsonl(tmp_path / "chat.jsonl", messages)
    # Interrupted while the second batch of 3 was on its way: it reached the gateway or not.
    sent = messages[:6] if landed else messages[:3]
    assert api.post(f"/memory/sessions/{session_id}/messages", json={"messages": sent}).is_success
    state = make_checkpoint(path, session_id, done=3, count=3, sending=3)

    code, _, err = run("import", str(path), "--session", session_id, "--batch", "3")
    assert code == 0, err
    assert f"resuming: {len(sent)} of 10 messages already imported" in err
    assert stored(api, session_id) == messages
    assert not state.exists()


def test_a_session_changed_since_the_interruption_refuses_to_resume(
    run: Run, api: httpx.Client, session_id: str, tmp_path: Path
) -> None:
    messages = conversation(10)
    path = write_jsonl(tmp_path / "chat.jsonl", messages)
    first = {"messages": messages[:3]}
    assert api.post(f"/memory/sessions/{session_id}/messages", json=first).is_success
    state = make_checkpoint(path, session_id, done=3, count=3, sending=3)
    other = {"messages": [{"role": "user", "content": "someone else wrote meanwhile"}]}
    assert api.post(f"/memory/sessions/{session_id}/messages", json=other).is_success

    code, out, err = run("import", str(path), "--session", session_id, "--batch", "3")
    assert code == 2 and out == ""
    assert f"cannot resume: session {session_id} has 4 messages" in err
    assert "left it at 3 (or 6 if its last batch landed)" in err and "--restart" in err
    assert state.exists()  # kept: nothing was decided for the operator
    assert len(stored(api, session_id)) == 4

    code, out, err = run("import", str(path), "--session", session_id, "--restart")
    assert code == 0, err
    assert f"session {session_id} now has 14 messages" in out
    assert stored(api, session_id) == [*messages[:3], *other["messages"], *messages]

    code, _, err = run("import", str(path), "--session", session_id + "-x")
    assert code == 0  # the checkpoint went with the completed import


def test_a_checkpoint_of_another_session_is_not_used(
    run: Run, session_id: str, tmp_path: Path
) -> None:
    path = write_jsonl(tmp_path / "chat.jsonl", conversation(4))
    make_checkpoint(path, "some-other-session", done=2, count=2, sending=2)
    code, _, err = run("import", str(path), "--session", session_id)
    assert code == 2
    assert "is the checkpoint of an import into session some-other-session" in err
    assert "--state-file" in err and "--restart" in err


def test_ctrl_c_mid_import_then_the_same_command_finishes_it(
    gateway: ServerThread, api_key: str, api: httpx.Client, session_id: str, tmp_path: Path
) -> None:
    messages = conversation(400)
    path = write_jsonl(tmp_path / "big.jsonl", messages)
    state = tmp_path / "big.jsonl.import-progress.json"
    command = [
        *GATEWAY, "import", str(path), "--session", session_id, "--batch", "1",
        "--url", gateway.url,
    ]  # fmt: skip
    env = {**os.environ, "MEMORY_GATEWAY_API_KEY": api_key}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the import made no progress"
            # Frozen while its progress is read and the signal sent: on a loaded machine
            # the import once finished between the two, and exited 0.
            process.send_signal(signal.SIGSTOP)
            if state.exists() and json.loads(state.read_text())["done"] >= 20:
                break
            process.send_signal(signal.SIGCONT)
            time.sleep(0.005)
        process.send_signal(signal.SIGINT)
        process.send_signal(signal.SIGCONT)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert "interrupted: " in err and "Run the same command again to resume" in err
    assert api_key not in out + err
    interrupted_at = len(stored(api, session_id))
    assert 20 <= interrupted_at < 400
    assert state.exists()

    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming: " in rerun.stderr
    assert f"session {session_id} now has 400 messages" in rerun.stdout
    assert stored(api, session_id) == messages  # each exactly once, in order
    assert not state.exists()


def test_no_gateway_listening_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], session_id: str, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    path = write_jsonl(tmp_path / "chat.jsonl", conversation(2))
    for args in (
        ["import", str(path), "--session", session_id],
        ["inspect", session_id],
        ["export", session_id],
        ["sessions"],
    ):
        assert main([*args, "--url", url]) == 1
        err = capsys.readouterr().err
        assert f"cannot reach the gateway at {url} — is `memory-gateway serve` running?" in err


def test_gateway_errors_are_shown_with_their_type_and_status(run: Run, session_id: str) -> None:
    code, out, err = run("inspect", session_id)
    assert code == 1 and out == ""
    assert f"memory-gateway inspect: session '{session_id}' not found (not_found, HTTP 404)" in err
    code, _, err = run("export", session_id, "--format", "markdown")
    assert code == 1 and "(not_found, HTTP 404)" in err


def test_a_missing_or_refused_key_names_the_option_and_the_variable(
    gateway: ServerThread, capsys: pytest.CaptureFixture[str], session_id: str
) -> None:
    """The command writes the Authorization header: its user gives a key with --api-key
    or the environment, which is what the error names (issue 34)."""
    for key in ([], ["--api-key", "EMPTY"]):
        assert main(["inspect", session_id, "--url", gateway.url, *key]) == 1
        err = capsys.readouterr().err
        assert "the gateway needs an API key: pass --api-key KEY, or set " in err
        assert "MEMORY_GATEWAY_API_KEY (or OPENAI_API_KEY)" in err
        assert "Authorization" not in err
    assert main(["sessions", "--url", gateway.url, "--api-key", "abcdefg"]) == 1
    err = capsys.readouterr().err
    assert "this API key is too short" in err and "pass --api-key KEY" in err


def shows(out: str, name: str, value: object) -> bool:
    """Whether inspect's header says ``name  value``."""
    return re.search(rf"│ {re.escape(name)} +{re.escape(str(value))} +│", out) is not None


def test_inspect_shows_the_tiers_and_the_last_receipt(
    gateway: ServerThread, run: Run, api_key: str, session_id: str
) -> None:
    memory = Memory(gateway, api_key, session_id)
    memory.add(16)  # hybrid: a summary of messages 1-15 is due
    state = memory.flush()
    assert [s["range"] for s in state["summaries"]] == [{"start": 1, "end": 15}]
    pin = memory.http.post(memory.base + "/pins", json={"content": "prefers aisle seats"}).json()

    code, out, err = run("inspect", session_id)
    assert code == 0, err
    assert shows(out, "session", session_id)
    assert shows(out, "messages", 16) and shows(out, "pending jobs", 0)
    assert "window (8 messages)" in out and "message 16 about topic 1" in out
    assert "summaries (1)" in out and "1-15" in out
    assert "pins (1)" in out and pin["id"] in out and "prefers aisle seats" in out
    assert "0.80" in out
    assert "no receipt yet" in out

    say(sdk(gateway, api_key, session_id), "which seat do I prefer?")
    code, out, _ = run("inspect", session_id)
    assert code == 0 and shows(out, "messages", 18)
    assert "last request's context, model fake-model" in out
    assert "window" in out and "budget 3000" in out and "summaries 1-15" in out

    code, out, _ = run("inspect", session_id, "--json")
    document = json.loads(out)
    assert document["message_count"] == 18
    assert document["last_receipt"]["receipt"]["budget_tokens"] == 3000


def test_sessions_lists_sizes_and_last_activity_newest_first(
    make_gateway: GatewayFactory,
    api_key: str,
    capsys: pytest.CaptureFixture[str],
    session_id: str,
    tmp_path: Path,
) -> None:
    clock = SteppedClock()
    run = Run(make_gateway(clock=clock), api_key, capsys)
    older, newer = session_id + "-older", session_id + "-newer"
    path = write_jsonl(tmp_path / "chat.jsonl", conversation(6))
    assert run("import", str(path), "--session", older)[0] == 0
    clock.advance(1.1)  # activity is kept in seconds
    assert run("import", str(path), "--session", newer, "--user", "ada", "--batch", "2")[0] == 0

    code, out, err = run("sessions")
    assert code == 0, err
    rows = [line for line in out.splitlines() if session_id in line]
    assert [newer in rows[0], older in rows[1]] == [True, True], out
    assert "ada" in rows[0] and " 6 " in rows[0] and "just now" in rows[0]
    assert "KiB" in rows[0] or " B " in rows[0]
    assert "2 sessions" in out

    code, out, _ = run("sessions", "--limit", "1")
    assert code == 0 and newer in out and older not in out
    code, out, _ = run("sessions", "--search", "older")
    assert code == 0 and older in out and newer not in out
    code, out, _ = run("sessions", "--search", "nothing-like-it")
    assert code == 0 and "no sessions matching 'nothing-like-it'" in out


def test_the_gateway_and_key_come_from_the_environment_or_the_config(
    gateway: ServerThread,
    api_key: str,
    session_id: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Memory(gateway, api_key, session_id).add(2)
    monkeypatch.setenv("OPENAI_API_KEY", api_key)
    monkeypatch.setenv("MEMORY_GATEWAY_URL", gateway.url)
    assert main(["inspect", session_id]) == 0
    assert shows(capsys.readouterr().out, "messages", 2)

    monkeypatch.delenv("MEMORY_GATEWAY_URL")
    config = tmp_path / "gateway.yaml"
    config.write_text(f"server:\n  host: 127.0.0.1\n  port: {gateway.port}\n")
    assert main(["inspect", session_id, "--config", str(config)]) == 0
    assert shows(capsys.readouterr().out, "messages", 2)

    monkeypatch.setenv("MEMORY_GATEWAY_API_KEY", api_key + "-another-tenant")
    assert main(["inspect", session_id, "--config", str(config)]) == 1  # not theirs
    assert "(not_found, HTTP 404)" in capsys.readouterr().err
