"""The catalog: a tenant's sessions listed, a session's receipts kept, pins edited.

Over real sockets and a real Redis, on one node and on a cluster (the indexes are
sharded over the slots, and the list merges them).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from devsupport.servers import ServerThread
from tests.support.clients import Memory, sdk
from tests.support.fixtures import GatewayFactory, on_one_redis_and_a_cluster

redis_server = on_one_redis_and_a_cluster()


def api(gateway: ServerThread, key: str) -> httpx.Client:
    return httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {key}"})


def listed(http: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    response = http.get("/memory/sessions", params=params)
    assert response.status_code == 200, response.text
    return list(response.json()["sessions"])


def test_sessions_are_listed_newest_activity_first_with_their_sizes(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    names = [f"{session_id}-{n}" for n in range(3)]
    memories = [Memory(gateway, api_key, name) for name in names]
    for n, memory in enumerate(memories):
        memory.add(2 * (n + 1))
    memories[0].add(1)  # the oldest becomes the newest
    with api(gateway, api_key) as http:
        sessions = listed(http)
    assert [s["session_id"] for s in sessions] == [names[0], names[2], names[1]]
    counts = {s["session_id"]: s["message_count"] for s in sessions}
    assert counts == {names[0]: 3, names[1]: 4, names[2]: 6}
    sizes = {s["session_id"]: s["bytes"] for s in sessions}
    assert sizes[names[2]] > sizes[names[1]] > 0  # more messages, more bytes
    for session in sessions:
        assert session["updated"] >= session["created"] > time.time() - 60
        assert session["ended"] is False


def test_search_limit_and_bad_limits(gateway: ServerThread, api_key: str) -> None:
    for name in ("alpha-1", "alpha-2", "beta-1", "b*ta[x]"):
        Memory(gateway, api_key, name).add(2)
    with api(gateway, api_key) as http:
        assert {s["session_id"] for s in listed(http, search="alpha")} == {"alpha-1", "alpha-2"}
        # Glob characters in a search are literal.
        assert [s["session_id"] for s in listed(http, search="*ta[")] == ["b*ta[x]"]
        assert {s["session_id"] for s in listed(http, search="ta")} == {"beta-1", "b*ta[x]"}
        assert len(listed(http, limit=2)) == 2
        for bad in ("0", "-1", "x", "1001"):
            response = http.get("/memory/sessions", params={"limit": bad})
            assert response.status_code == 400
            assert response.json()["error"]["param"] == "limit"


def test_each_tenant_lists_only_its_own_and_erased_sessions_leave_the_list(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    other_key = api_key + "-other"
    Memory(gateway, api_key, session_id).add(2)
    Memory(gateway, other_key, session_id + "-theirs").add(2)
    with api(gateway, api_key) as mine, api(gateway, other_key) as theirs:
        assert [s["session_id"] for s in listed(mine)] == [session_id]
        assert [s["session_id"] for s in listed(theirs)] == [session_id + "-theirs"]
        assert mine.delete(f"/memory/sessions/{session_id}").status_code == 204
        assert listed(mine) == []


def test_receipts_of_recorded_turns_match_what_was_forwarded(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    headers = []
    for n in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": f"question {n}"}]
        )
        headers.append(raw.headers)
    with api(gateway, api_key) as http:
        response = http.get(f"/memory/sessions/{session_id}/receipts")
    assert response.status_code == 200, response.text
    receipts = response.json()["receipts"]
    assert len(receipts) == 3
    for receipt, sent in zip(receipts, reversed(headers), strict=True):  # newest first
        assert receipt["model"] == "fake-model"
        assert receipt["client_tokens"] > 0
        assert receipt["receipt"]["total_tokens"] == int(sent["x-memory-context-tokens"])
        tiers = ";".join(f"{t}={n}" for t, n in receipt["receipt"]["tiers"].items())
        assert sent["x-memory-receipt"].startswith(tiers)
    assert receipts[0]["at"] >= receipts[1]["at"] >= receipts[2]["at"]


@pytest.mark.parametrize("kept", [0, 4])
def test_receipts_are_capped(
    make_gateway: GatewayFactory, api_key: str, session_id: str, kept: int
) -> None:
    gateway = make_gateway(memory={"preset": "rolling-window", "receipts": kept})
    client = sdk(gateway, api_key, session_id)
    for n in range(kept + 3):
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": f"q{n}"}]
        )
    with api(gateway, api_key) as http:
        receipts = http.get(f"/memory/sessions/{session_id}/receipts").json()["receipts"]
    assert len(receipts) == kept
    # The newest kept: the last turn's window ends at the answer before its question.
    assert [r["receipt"]["window_indexes"][-1] for r in receipts] == [
        2 * (kept + 3 - n) for n in range(1, kept + 1)
    ]


def test_a_pin_is_edited_in_place(gateway: ServerThread, api_key: str, session_id: str) -> None:
    memory = Memory(gateway, api_key, session_id)
    memory.add(2)
    pin = memory.http.post(memory.base + "/pins", json={"content": "likes tea"}).json()
    edited = memory.http.patch(
        memory.base + f"/pins/{pin['id']}", json={"content": "likes green tea", "importance": 1}
    )
    assert edited.status_code == 200, edited.text
    pins = memory.http.get(memory.base + "/pins").json()["pins"]
    assert [(p["id"], p["content"], p["importance"]) for p in pins] == [
        (pin["id"], "likes green tea", 1)
    ]
    assert "likes green tea" in str(memory.context()["messages"])
    missing = memory.http.patch(memory.base + "/pins/pin_nope", json={"content": "x"})
    assert missing.status_code == 404
    empty = memory.http.patch(memory.base + f"/pins/{pin['id']}", json={"content": ""})
    assert empty.status_code == 400
