"""A gateway header sent twice is refused (400, the header in ``param``), never read as
its first value: a proxy or log in front of the gateway may have read the last one."""

from __future__ import annotations

import httpx
import pytest

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import ServerThread

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}]}


def refused_for(response: httpx.Response, header: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_header"
    assert error["param"] == header


@pytest.mark.parametrize(
    ("header", "values"),
    [
        ("X-Session-Id", ("a", "b")),
        ("X-Session-Id", ("same", "same")),  # even equal: which one counts is not the point
        ("X-User-Id", ("alice", "bob")),
        ("X-Memory-Mode", ("off", "on")),
    ],
)
def test_a_gateway_header_sent_twice_is_refused_by_the_chat_route(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    api_key: str,
    session_id: str,
    header: str,
    values: tuple[str, str],
) -> None:
    headers = [("Authorization", f"Bearer {api_key}")]
    if header != "X-Session-Id":
        headers.append(("X-Session-Id", session_id))
    headers += [(header, value) for value in values]
    response = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=headers)
    refused_for(response, header)
    assert fake_upstream.proxied_requests() == []  # refused before anything went upstream


IMPORT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


@pytest.mark.parametrize(("path", "body"), [("/context", CHAT), ("/messages", IMPORT)])
def test_a_user_id_sent_twice_is_refused_by_the_memory_api(
    gateway: ServerThread, api_key: str, session_id: str, path: str, body: dict[str, object]
) -> None:
    headers = [
        ("Authorization", f"Bearer {api_key}"),
        ("X-User-Id", "alice"),
        ("x-user-id", "bob"),  # header names are case-insensitive: still two
    ]
    url = f"{gateway.url}/memory/sessions/{session_id}{path}"
    response = httpx.post(url, json=body, headers=headers)
    refused_for(response, "X-User-Id")


def test_each_header_sent_once_is_served(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    headers = [
        ("Authorization", f"Bearer {api_key}"),
        ("X-Session-Id", session_id),
        ("X-User-Id", "alice"),
        ("X-Memory-Mode", "read"),
    ]
    response = httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 200, response.text
