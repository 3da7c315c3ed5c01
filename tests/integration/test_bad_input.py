"""Bad input gets an OpenAI-style error with a 4xx status, never a 500."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devsupport.fake_upstream import FakeUpstream
from devsupport.gateways import build_settings, start_gateway
from devsupport.servers import RedisProcess, ServerThread
from gateway.routes.openapi import openapi_document
from tests.support.envelope import assert_envelope
from tests.support.fixtures import GatewayFactory, redis_dump

VALID = b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}'
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def chat(*messages: dict[str, Any], **fields: Any) -> bytes:
    return json.dumps({"model": "fake-model", "messages": list(messages), **fields}).encode()


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def tool(call_id: str | None) -> dict[str, Any]:
    message = {"role": "tool", "content": "42"}
    return message if call_id is None else {**message, "tool_call_id": call_id}


ASKED = {"role": "assistant", "content": None, "tool_calls": [CALL]}


@pytest.fixture(scope="module")
def gateway(
    fake_upstream_server: tuple[FakeUpstream, ServerThread], redis_server: RedisProcess
) -> Iterator[ServerThread]:
    """One gateway for the module: these tests only send requests, and starting one per
    case would cost a second each."""
    upstream_url = fake_upstream_server[1].url + "/v1"
    settings = build_settings(upstream_url, redis_server.url, server={"max_body_bytes": 200_000})
    started = start_gateway(settings)
    yield started
    started.stop()


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
        # Each of these was a 500 (RecursionError, UnicodeEncodeError, AttributeError) or
        # a 200 that stored a message every later turn would carry upstream.
        (b'{"model": "m", "x": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", {}, 400, None),
        (chat(user("a\ud800b")), {}, 400, None),
        (chat(user("x"), temperature=float("nan")), {}, 400, None),
        (
            chat(user([{"type": "image_url", "image_url": "http://x"}])),
            {},
            400,
            "messages.0.content",
        ),
        (
            chat(user([{"type": "image_url", "image_url": {"url": 5}}])),
            {},
            400,
            "messages.0.content",
        ),
        (chat(user([{"type": "text", "text": 5}])), {}, 400, "messages.0.content"),
        (
            chat(user("q"), {**ASKED, "tool_calls": [{**CALL, "function": "f"}]}, tool("c1")),
            {},
            400,
            "messages.1.tool_calls.0.function",
        ),
        (chat(user("q"), {**ASKED, "tool_calls": ["c1"]}), {}, 400, "messages.1.tool_calls.0"),
        (chat(user("q"), ASKED, tool(None)), {}, 400, "messages.2.tool_call_id"),
        (chat(user("q"), ASKED, tool("c2")), {}, 400, "messages.2.tool_call_id"),
        (chat(user("q"), tool("c1")), {}, 400, "messages.1.tool_call_id"),
        (chat(user("q"), {"role": "user", "content": "x", "name": 5}), {}, 400, "messages.1.name"),
        (chat(user("q"), {"role": "function", "content": "x"}), {}, 400, "messages.1.name"),
        (chat(user("q"), model="m" * 2000), {}, 400, "model"),
        (chat(user("q"), model=""), {}, 400, "model"),
    ],
)
def test_bad_requests_get_an_error_envelope(
    gateway: ServerThread,
    body: bytes,
    headers: dict[str, str],
    status: int,
    param: str | None,
) -> None:
    sent = {"Authorization": "Bearer sk-bad-request-key", "X-Session-Id": "s1", **headers}
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
    # uvicorn's parser rejects \x01 in a header before the app runs: the protocol's 400
    # (its envelope: tests/unit/http/test_server.py).
    reply = raw_request(gateway, b"abc\x01def")
    assert reply.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), reply[:300]


def test_utf8_session_ids_are_accepted(gateway: ServerThread, api_key: str) -> None:
    reply = raw_request(gateway, "caf\u00e9-\u4f1a\u8a71".encode(), key=api_key)
    assert reply.split(b"\r\n", 1)[0].endswith(b" 200 OK"), reply[:300]


def raw_request(
    gateway: ServerThread, session: bytes | None, key: str = "sk-raw-client-key", extra: bytes = b""
) -> bytes:
    """Send a request by hand: httpx refuses to put such bytes in a header."""
    session_header = b"" if session is None else b"X-Session-Id: " + session + b"\r\n"
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + key.encode() + b"\r\n" + session_header + extra + b""
        b"Content-Length: " + str(len(VALID)).encode() + b"\r\n"
        b"Connection: close\r\n\r\n" + VALID
    )
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(request)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/messages", {"messages": [{"role": "assistant", "tool_calls": "abc"}]},
         "messages.0.tool_calls"),
        ("/messages", {"messages": [user([{"type": "image_url", "image_url": "u"}])]},
         "messages.0.content"),
        ("/messages", {"messages": [{"role": "user", "content": "x", "name": {"a": 1}}]},
         "messages.0.name"),
        ("/messages", {"messages": [tool("c1")]}, "messages.0.tool_call_id"),
        ("/messages", {"messages": [user("q"), tool(None)]}, "messages.1.tool_call_id"),
        ("/messages", {"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
        ("/messages", {"messages": []}, "messages"),
        ("/messages", [], None),
        ("/context", {"model": "fake-model", "messages": [tool("c9")]},
         "messages.0.tool_call_id"),
        ("/pins", {"content": "x", "source_index": 10**30}, "source_index"),
        ("/pins", {"content": 5}, "content"),
        ("/pins", {"content": "x", "importance": 2}, "importance"),
    ],
)  # fmt: skip
def test_memory_api_bad_bodies_get_an_error_envelope(
    gateway: ServerThread, redis_server: RedisProcess, path: str, body: Any, param: str | None
) -> None:
    http = httpx.Client(base_url=gateway.url, headers={"Authorization": "Bearer sk-bad-api"})
    with http:
        # The session exists (pins need one) and ends on an answered turn.
        seeded = http.post(
            "/memory/sessions/bad-api/messages",
            json={"messages": [user("hello"), {"role": "assistant", "content": "hi"}]},
        )
        assert seeded.status_code == 200, seeded.text
        before = redis_dump_of(redis_server)
        response = http.post("/memory/sessions/bad-api" + path, json=body)
        after = redis_dump_of(redis_server)
        http.delete("/memory/sessions/bad-api")
    assert response.status_code == 400, response.text
    assert_envelope(response.json())
    assert response.json()["error"]["param"] == param
    assert after == before  # nothing of the rejected request was stored


def test_a_memory_api_body_nested_past_the_parsers_limit_gets_a_400(
    gateway: ServerThread,
) -> None:
    nested = b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    response = httpx.post(
        gateway.url + "/memory/sessions/nested/messages",
        content=nested,
        headers={"Authorization": "Bearer sk-bad-api", "Content-Type": "application/json"},
    )
    assert response.status_code == 400, response.text
    assert_envelope(response.json())


def test_tool_results_sent_alone_must_answer_the_stored_call(
    gateway: ServerThread, api_key: str, session_id: str, redis_server: RedisProcess
) -> None:
    headers = {"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id}
    url = gateway.url + "/v1/chat/completions"
    body = {"model": "tool-caller", "messages": [user("weather in Paris?")]}
    asked = httpx.post(url, json=body, headers=headers)
    assert asked.status_code == 200, asked.text
    call_id = asked.json()["choices"][0]["message"]["tool_calls"][0]["id"]
    before = redis_dump_of(redis_server)
    orphan = httpx.post(
        url, json={"model": "tool-caller", "messages": [tool(call_id + "-other")]}, headers=headers
    )
    assert orphan.status_code == 400, orphan.text
    assert orphan.json()["error"]["param"] == "messages.0.tool_call_id"
    assert redis_dump_of(redis_server) == before
    # A single-message client sends only the result: it answers the stored call.
    answered = httpx.post(
        url, json={"model": "tool-caller", "messages": [tool(call_id)]}, headers=headers
    )
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["content"] == "The tool said: 42"
    # Sent alone again, it is a new turn (single-message clients do not regenerate), and
    # the call it answers is answered already.
    before = redis_dump_of(redis_server)
    again = httpx.post(
        url, json={"model": "tool-caller", "messages": [tool(call_id)]}, headers=headers
    )
    assert again.status_code == 400, again.text
    assert redis_dump_of(redis_server) == before
    # A history that branched from the store: only the new result would be kept, after
    # the stored answer, where it answers nothing (found by test_fuzz).
    asked_again = {**ASKED, "tool_calls": [{**CALL, "id": call_id}]}
    branched = [user("something else"), asked_again, tool(call_id)]
    refused = httpx.post(url, json={"model": "tool-caller", "messages": branched}, headers=headers)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "messages.2.tool_call_id"
    assert redis_dump_of(redis_server) == before


@pytest.mark.parametrize(
    ("session", "extra"),
    [
        # Memory off: forwarded as sent, but for the gateway's own headers.
        ("café".encode(), "X-Memory-Mode: off\r\nUser-Agent: naïve\r\n".encode()),
        (None, "User-Agent: naïve\r\n".encode()),  # no session: passed through
    ],
)
def test_non_ascii_headers_are_forwarded_upstream_as_sent(
    gateway: ServerThread, fake_upstream: FakeUpstream, session: bytes | None, extra: bytes
) -> None:
    """These were a 500: httpx encodes str header values as ASCII."""
    reply = raw_request(gateway, session, extra=extra)
    assert reply.split(b"\r\n", 1)[0].endswith(b" 200 OK"), reply[:300]
    seen = fake_upstream.proxied_requests()[-1].headers
    assert "naïve".encode().decode("latin-1") in seen.values()
    assert "x-session-id" not in seen and "x-memory-mode" not in seen


def test_an_endless_body_is_refused_before_it_ends(make_gateway: GatewayFactory) -> None:
    """No Content-Length, chunked: the gateway stops reading at the limit, not at the end."""
    gateway = make_gateway(server={"max_body_bytes": 1_000_000})
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer sk-big-client-key\r\n"
        b"X-Session-Id: big\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n%s\r\n" % (65536, b"[" * 65536)
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(head)
        sent = 0
        try:
            # Up to 1 GiB, which the gateway must never hold: it answers after ~1 MB.
            while sent < 1 << 30:
                sock.sendall(chunk)
                sent += 65536
        except OSError:
            pass  # the gateway answered and closed: our sending fails, as it should
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:200]
    body = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "payload_too_large"
    assert sent < 64 << 20, sent
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("value", [b"a\rb", b"a\nb", b"a\r\nX-Injected: 1"])
def test_cr_lf_in_a_header_is_refused_by_the_http_parser(
    gateway: ServerThread, value: bytes
) -> None:
    """uvicorn's parser (httptools and h11 alike) answers 400 before the app runs.

    That 400 is the protocol's envelope (gateway/http/server.py): the request never
    reaches the gateway's code (nothing is read, nothing stored). ``a\r\nX-Injected: 1``
    is two headers on the wire, the first one ending at the CR: either way no header value
    holds a CR or LF.
    """
    reply = raw_request(gateway, value)
    status = reply.split(b"\r\n", 1)[0]
    assert status.endswith((b" 400 Bad Request", b" 200 OK")), reply[:300]
    if status.endswith(b" 200 OK"):
        assert value == b"a\r\nX-Injected: 1"


def test_openapi_document_matches_the_routes(gateway: ServerThread) -> None:
    served = httpx.get(gateway.url + "/openapi.json")
    assert served.status_code == 200
    assert served.json() == json.loads(json.dumps(openapi_document()))
    documented = {
        (path, method.upper())
        for path, item in served.json()["paths"].items()
        for method in item
        if method != "parameters"
    }
    app = gateway.server.config.app
    routed = {
        (route.path, method)
        for route in app.routes
        if route.path.startswith("/memory/")
        or route.path in ("/v1/chat/completions", "/v1/responses", "/v1/messages")
        for method in route.methods - {"HEAD"}
    }
    assert routed and documented == routed


def redis_dump_of(server: RedisProcess) -> list[bytes]:
    with server.client() as client:
        return sorted(redis_dump(client))


@pytest.mark.parametrize("path", ["/memory/sessions/", "/ui/", "/memory/sessions/a%2Fb"])
def test_no_redirect_is_built_from_the_clients_host_header(
    make_gateway: GatewayFactory, path: str
) -> None:
    """Starlette redirected "/x/" to "/x" at the Host the client named, unauthenticated."""
    gateway = make_gateway(ui={"enabled": True, "admin_key": "inspector-admin-key-0123456789"})
    headers = {"Host": "evil.example", "Authorization": "Bearer sk-redirect-test-key"}
    answer = httpx.get(gateway.url + path, headers=headers)
    assert "location" not in answer.headers
    assert answer.status_code == 404
    assert_envelope(answer.json())
