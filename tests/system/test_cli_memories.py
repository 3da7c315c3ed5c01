"""``memory-gateway facts`` and ``memory-gateway search`` against a real gateway (in
process, output captured)."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.cli import main
from tests.support.clients import register_content
from tests.support.fixtures import GatewayFactory


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wide tables, and no gateway or key from the developer's own environment."""
    monkeypatch.setenv("COLUMNS", "240")
    for name in ("MEMORY_GATEWAY_URL", "MEMORY_GATEWAY_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def test_facts_listed_corrected_deleted_and_memories_searched(
    make_gateway: GatewayFactory,
    api_key: str,
    session_id: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    gateway = make_gateway(memory={"preset": "hybrid-recall"})
    texts = ["My seat is 42B on the night train.", *[f"filler {i} about rain" for i in range(6)]]
    messages = [
        {"role": role, "content": register_content(text if role == "user" else "noted")}
        for text in texts
        for role in ("user", "assistant")
    ]
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {api_key}"}) as api:
        path = f"/memory/sessions/{session_id}"
        sent = api.post(path + "/messages", json={"messages": messages},
                        headers={"X-User-Id": "cli-user"})  # fmt: skip
        assert sent.status_code == 200 and api.post(path + "/flush").status_code == 200
    connection = ["--url", gateway.url, "--api-key", api_key]

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([*args, *connection])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = run("facts", session_id, "--json")
    assert code == 0
    seat = next(f for f in json.loads(out)["facts"] if f["key"] == "seat")
    code, out, _ = run("facts", session_id)
    assert code == 0 and seat["id"] in out and "current" in out
    code, out, _ = run("facts", session_id, "--correct", seat["id"], "My seat is 17C.")
    assert code == 0 and f"corrected {seat['id']}" in out
    facts = json.loads(run("facts", session_id, "--json")[1])["facts"]
    fixed = next(f for f in facts if f.get("corrected"))
    assert fixed["text"] == "My seat is 17C."
    code, out, _ = run("search", "which seat?", "--user", "cli-user", "--json")
    results = json.loads(out)["results"]
    assert code == 0 and results[0]["kind"] == "fact" and results[0]["id"] == fixed["id"]
    code, out, _ = run("search", "which seat?", "--session", session_id, "--limit", "2")
    assert code == 0 and "17C" in out and "fact" in out
    assert run("facts", session_id, "--delete", fixed["id"])[0] == 0
    code, _, err = run("facts", session_id, "--delete", fixed["id"])
    assert code == 1 and "fact not found" in err and "HTTP 404" in err
    code, _, err = run("search", "seat")
    assert code == 2 and "--session or --user" in err
