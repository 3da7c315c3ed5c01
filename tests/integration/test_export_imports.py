"""``POST /memory/users/{uid}/imports?format=chatgpt|claude``: a service's data export, its
``conversations.json`` as the body, into sessions of the user (real Redis, real sockets)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devsupport.servers import ServerThread
from tests.support.envelope import assert_envelope
from tests.support.fixtures import GatewayFactory

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exports"
LISBON = "chatgpt-0c6f3a52-1b7e-4d0a-9a11-5f2e8c3d4a01"
SOURDOUGH = "chatgpt-7d2b9e40-58c1-4f3e-b0d2-2a9c6e1f7b02"
GARDEN = "claude-3f9a1c2e-6b4d-4e8f-a0b1-c2d3e4f5a601"


@pytest.fixture
def api(gateway: ServerThread, api_key: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=gateway.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    ) as client:
        yield client


def body(fmt: str) -> bytes:
    return (FIXTURES / f"{fmt}-conversations.json").read_bytes()


def post(api: httpx.Client, fmt: str | None, content: bytes, user: str = "ada") -> httpx.Response:
    params = {"format": fmt} if fmt else {}
    return api.post(f"/memory/users/{user}/imports", params=params, content=content)


def exported(api: httpx.Client, session: str) -> list[dict[str, Any]]:
    response = api.get(f"/memory/sessions/{session}/export")
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


def test_a_chatgpt_export_through_the_api_then_again(api: httpx.Client) -> None:
    response = post(api, "chatgpt", body("chatgpt"))
    assert response.status_code == 200, response.text
    answer = response.json()
    assert {k: v for k, v in answer.items() if k != "sessions"} == {
        "user_id": "ada", "conversations": 3, "imported": 2, "existing": 0, "empty": 1,
        "messages": 8,
    }  # fmt: skip
    assert answer["sessions"][0] == {
        "session_id": LISBON, "title": "Lisbon trip planning", "status": "imported",
        "messages": 4, "message_count": 4,
    }  # fmt: skip
    lisbon = exported(api, LISBON)
    assert [m["timestamp"] for m in lisbon][:2] == ["2024-05-02T09:15:00Z", "2024-05-02T09:15:20Z"]
    assert sorted(api.get("/memory/users/ada").json()["sessions"]) == [LISBON, SOURDOUGH]
    found = api.post("/memory/users/ada/search", json={"query": "the Lisbon flight seat"})
    seat = next(r for r in found.json()["results"] if "14C" in r["text"])
    assert seat["session_id"] == LISBON and seat["date"].startswith("2024-05-02")

    again = post(api, "chatgpt", body("chatgpt")).json()  # a retry adds nothing
    assert (again["imported"], again["existing"], again["messages"]) == (0, 2, 0)
    assert [s["status"] for s in again["sessions"]] == ["existing", "existing"]
    assert exported(api, LISBON) == lisbon


def test_a_claude_export_through_the_api(api: httpx.Client) -> None:
    response = post(api, "claude", body("claude"))
    assert response.status_code == 200, response.text
    assert (response.json()["imported"], response.json()["messages"]) == (2, 6)
    garden = exported(api, GARDEN)
    assert garden[3]["timestamp"].startswith("2024-06-05T07:45:30")
    assert garden[3]["content"].startswith("Probably early blight")


def refused(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert_envelope(response.json())
    return error


def test_bad_requests_are_refused_naming_the_conversation(api: httpx.Client) -> None:
    assert refused(post(api, None, body("claude")), 400)["param"] == "format"
    assert refused(post(api, "gemini", body("claude")), 400)["param"] == "format"
    error = refused(post(api, "chatgpt", body("claude")), 400)
    assert error["param"] == "0"
    assert error["message"] == (
        'conversation 1: "mapping" must be an object, not null: is this a Claude export?'
    )
    assert refused(post(api, "claude", b'{"conversations": []}'), 400)["message"].startswith(
        "expected an array of conversations"
    )
    assert refused(post(api, "claude", b"[{"), 400)["code"] == "invalid_json"
    future = body("claude").replace(b"2024-06-10T20:11:40", b"2099-06-10T20:11:40")
    error = refused(post(api, "claude", future), 400)
    assert error["param"] == "1" and "conversation 2: " in error["message"]
    assert "future" in error["message"]
    assert api.get("/memory/users/ada").status_code == 404  # nothing was imported


def test_a_session_of_another_user_refuses_the_whole_import(api: httpx.Client) -> None:
    taken = {"messages": [{"role": "user", "content": "mine"}]}
    sent = api.post(f"/memory/sessions/{GARDEN}/messages", json=taken, headers={"X-User-Id": "bo"})
    assert sent.status_code == 200
    error = refused(post(api, "claude", body("claude")), 404)
    assert error["param"] == "session_id"
    assert api.get("/memory/users/ada").status_code == 404  # nothing written for ada
    assert len(exported(api, GARDEN)) == 1


def test_an_export_over_the_body_limit(make_gateway: GatewayFactory, api_key: str) -> None:
    gateway = make_gateway(server={"max_body_bytes": 2000})
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {api_key}"}) as api:
        refused(post(api, "chatgpt", body("chatgpt")), 413)
