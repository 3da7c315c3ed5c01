"""The bounded-head httptools protocol, on a real socket (uvicorn in a thread)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.http_protocol import BoundedHeadProtocol
from tests.support.servers import ServerThread

LIMIT = 8 * 1024
seen: list[str] = []


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers every request with the size of its body and its X-Id header."""
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    ident = dict(scope["headers"]).get(b"x-id", b"").decode()
    seen.append(ident)
    answer = f"{ident}:{len(body)}".encode()
    headers = [(b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread(
        echo_app, http=BoundedHeadProtocol, h11_max_incomplete_event_size=LIMIT
    ) as running:
        yield running


def exchange(server: ServerThread, pieces: list[bytes]) -> bytes:
    """Sends the pieces as separate writes and reads until the server closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for piece in pieces:
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        return received


def head(ident: str, size: int = 0, body: int = 0, *, last: bool = True) -> bytes:
    """A request head of about ``size`` bytes (padded with a header) and its body; the
    ``last`` one on its connection asks the server to close after answering."""
    close = "Connection: close\r\n" if last else ""
    start = f"POST /x HTTP/1.1\r\nHost: t\r\nX-Id: {ident}\r\n{close}Content-Length: {body}\r\n"
    padding = max(0, size - len(start) - 12)
    return (start + f"X-Pad: {'a' * padding}\r\n\r\n").encode() + b"b" * body


def test_a_head_under_the_limit_is_served_even_in_small_pieces(server: ServerThread) -> None:
    request = head("small", LIMIT - 200)
    answer = exchange(server, [request[i : i + 100] for i in range(0, len(request), 100)])
    assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
    assert answer.endswith(b"small:0")


@pytest.mark.parametrize("pieces", [1, 64])
def test_a_head_past_the_limit_is_refused_before_the_app(server: ServerThread, pieces: int) -> None:
    seen.clear()
    request = head("huge", 64 * LIMIT)
    step = len(request) // pieces + 1
    answer = exchange(server, [request[i : i + step] for i in range(0, len(request), step)])
    assert answer.startswith(b"HTTP/1.1 400"), answer[:100]
    assert b"connection: close" in answer
    assert "huge" not in seen


def test_a_large_body_does_not_count_against_the_head(server: ServerThread) -> None:
    # Head and body in one write: the body is read as a body, not as more head.
    answer = exchange(server, [head("body", 100, body=20 * LIMIT)])
    assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
    assert answer.endswith(f"body:{20 * LIMIT}".encode())


def test_keep_alive_and_pipelined_requests_each_get_the_whole_limit(
    server: ServerThread,
) -> None:
    # Three requests of a head near the limit each, on one connection, in one write.
    requests = b"".join(head(f"r{n}", LIMIT - 300, body=10, last=n == 2) for n in range(3))
    answer = exchange(server, [requests])
    assert answer.count(b"HTTP/1.1 200") == 3, answer[:300]
    for n in range(3):
        assert f"r{n}:10".encode() in answer
