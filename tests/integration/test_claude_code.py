"""Claude Code (``claude -p``, the real CLI) through the gateway to the fake upstream's
Messages API: memory across separate runs of one session, a resumed conversation that
resends its history lined up with memory, and each stored log exactly what was said and
heard. The CLI is installed once into a cache directory (``tests/support/claude_code``).
"""

from __future__ import annotations

from pathlib import Path

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess, ServerThread
from devsupport.stored import stored_log
from gateway.memory.model import content_text
from tests.support.claude_code import ask_claude


def said_and_heard(redis_server: RedisProcess, key: str, session: str) -> list[tuple[str, str]]:
    return [(m["role"], content_text(m["content"])) for m in stored_log(redis_server, key, session)]


def test_claude_code_remembers_across_runs_of_one_session(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    tmp_path: Path,
) -> None:
    run = {"base_url": gateway.url, "api_key": api_key, "session_id": session_id}
    first = ask_claude("my seat is 14C", home=tmp_path / "a", **run)
    # A new run, in another directory: Claude Code sends only the new prompt, and the
    # gateway's memory is the conversation.
    second = ask_claude("what is my seat?", home=tmp_path / "b", **run)
    assert second == "Your seat is 14C."
    log = said_and_heard(redis_server, api_key, session_id)
    assert [role for role, _ in log] == ["user", "assistant", "user", "assistant"]
    # What the user typed (after the reminder block Claude Code puts first) and what
    # Claude Code printed.
    assert log[0][1].endswith("my seat is 14C") and log[1][1] == first
    assert log[2][1].endswith("what is my seat?") and log[3][1] == second
    forwarded = fake_upstream.messages_requests()[-1]
    assert forwarded.headers["x-api-key"] == api_key
    assert "x-session-id" not in forwarded.headers
    assert forwarded.query == b"beta=true"


def test_a_resumed_conversation_lines_up_with_memory(
    gateway: ServerThread,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    tmp_path: Path,
) -> None:
    run = {"base_url": gateway.url, "api_key": api_key, "home": tmp_path}
    ask_claude("my dog is Rex", session_id=session_id, **run)
    # --continue resends the first turn with the new prompt: not stored twice.
    answer = ask_claude("what is my dog?", session_id=session_id, resume=True, **run)
    assert answer == "Your dog is Rex."
    log = said_and_heard(redis_server, api_key, session_id)
    assert [role for role, _ in log] == ["user", "assistant", "user", "assistant"]
    assert log[3][1] == answer
