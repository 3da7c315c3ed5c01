"""Bad input gets an OpenAI-style error with a 4xx status, never a 500."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.integration.conftest import GatewayFactory
from tests.support.servers import ServerThread

pytestmark = pytest.mark.integration

VALID = b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}'


@pytest.mark.parametrize(
    ("body", "headers", "status", "param"),
    [
        (b"{not json", {}, 400, None),
        (b"[1, 2]", {}, 400, None),
        (b'{"model": "m"}', {}, 400, "messages"),
        (b'{"model": "m", "messages": "hi"}', {}, 400, "messages"),
        (b'{"model": "m", "messages": []}', {}, 400, "messages"),
        (
            b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}',
            {},
            400,
            "messages.0.role",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": 5}]}',
            {},
            400,
            "messages.0.content",
        ),
        (b'{"model": "m", "stream": "yes", "messages": [{"role": "user"}]}', {}, 400, "stream"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', {}, 400, "model"),
        (b"\xff\xfe", {}, 400, None),
        (VALID, {"X-Session-Id": "s" * 129}, 400, "X-Session-Id"),
        (VALID, {"X-Session-Id": ""}, 400, "X-Session-Id"),
        (VALID, {"X-User-Id": "u" * 200}, 400, "X-User-Id"),
        (VALID, {"X-Memory-Mode": "sometimes"}, 400, "X-Memory-Mode"),
        (
            b'{"model": "m", "messages": [' + b'{"role": "user", "content": "x"},' * 20000 + b"]}",
            {},
            413,
            None,
        ),
    ],
)
def test_bad_requests_get_an_error_envelope(
    make_gateway: GatewayFactory,
    body: bytes,
    headers: dict[str, str],
    status: int,
    param: str | None,
) -> None:
    gateway = make_gateway(server={"max_body_bytes": 200_000})
    sent = {"Authorization": "Bearer sk-bad", "X-Session-Id": "s1", **headers}
    response = httpx.post(gateway.url + "/v1/chat/completions", content=body, headers=sent)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize("session", ["abc\tdef", "zero\u200bwidth", "next\u0085line"])
def test_control_characters_in_session_id_get_an_error_envelope(
    gateway: ServerThread, session: str
) -> None:
    reply = raw_request(gateway, session.encode("utf-8"))
    assert reply.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), reply[:300]
    assert b'"param":"X-Session-Id"' in reply


def test_session_id_bytes_the_http_parser_refuses_still_get_a_400(gateway: ServerThread) -> None:
    # uvicorn's parser rejects \x01 in a header before the app runs: a 400, not an envelope.
    reply = raw_request(gateway, b"abc\x01def")
    assert reply.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), reply[:300]


def test_utf8_session_ids_are_accepted(gateway: ServerThread, api_key: str) -> None:
    reply = raw_request(gateway, "caf\u00e9-\u4f1a\u8a71".encode(), key=api_key)
    assert reply.split(b"\r\n", 1)[0].endswith(b" 200 OK"), reply[:300]


def raw_request(gateway: ServerThread, session: bytes, key: str = "sk-raw") -> bytes:
    """Send a request by hand: httpx refuses to put such bytes in a header."""
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + key.encode() + b"\r\n"
        b"X-Session-Id: " + session + b"\r\nContent-Length: " + str(len(VALID)).encode() + b"\r\n"
        b"Connection: close\r\n\r\n" + VALID
    )
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(request)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply
