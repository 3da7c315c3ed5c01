"""One request writes at most ``memory.max_record_bytes`` of history at once: Redis runs
a turn's record as one script, during which it serves no other tenant. A first request
carrying a longer history is refused before anything is forwarded; the memory API's
import writes the same history in batches, after which the conversation goes on."""

from __future__ import annotations

import httpx

from devsupport.fake_upstream import FakeUpstream
from tests.support.clients import register_content
from tests.support.fixtures import GatewayFactory

LIMIT = 20_000


def history(n: int) -> list[dict[str, str]]:
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": register_content(f"message {i} of a long conversation: " + "x" * 1000),
        }
        for i in range(n)
    ]


def test_a_history_past_the_bound_is_a_413_until_imported(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(memory={"max_record_bytes": LIMIT})
    auth = {"Authorization": f"Bearer {api_key}"}
    old = history(40)  # ~41 KB of text the session does not hold
    new = {"role": "user", "content": register_content("and what did I say first?")}
    body = {"model": "fake-model", "messages": [*old, new]}
    with httpx.Client(base_url=gateway.url, headers=auth, timeout=30) as http:
        refused = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": session_id})
        assert refused.status_code == 413, refused.text
        error = refused.json()["error"]
        assert (error["param"], error["code"]) == ("messages", "payload_too_large")
        assert "memory.max_record_bytes" in error["message"]
        assert "POST /memory/sessions/{session_id}/messages" in error["message"]  # the import
        assert fake_upstream.proxied_requests() == []  # nothing was forwarded
        assert http.get(f"/memory/sessions/{session_id}").status_code == 404  # nor stored

        imported = http.post(f"/memory/sessions/{session_id}/messages", json={"messages": old})
        assert imported.status_code == 200, imported.text
        assert imported.json()["message_count"] == 40  # in batches of at most LIMIT bytes

        answered = http.post(
            "/v1/chat/completions", json=body, headers={"X-Session-Id": session_id}
        )
        assert answered.status_code == 200, answered.text
        assert answered.headers["x-memory-status"] == "ok"
        assert http.get(f"/memory/sessions/{session_id}").json()["message_count"] == 42

        # Read mode records nothing: the same long history is no write, and no 413.
        fresh = {"X-Session-Id": session_id + "-read", "X-Memory-Mode": "read"}
        assert http.post("/v1/chat/completions", json=body, headers=fresh).status_code == 200
