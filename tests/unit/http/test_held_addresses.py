"""An address refused again and again is turned away when it connects, before its
request is read (``http/refused_addresses.py``), on a real socket (uvicorn in a thread)."""

from __future__ import annotations

import functools
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from devsupport.servers import ServerThread
from gateway.errors import TooManyRequests
from gateway.http import refusals
from gateway.http.refused_addresses import HOLD_AFTER
from gateway.http.server import BoundedHeadProtocol, ClientLimits, with_mapped_forms
from tests.unit.http.test_server import read_until_closed

served: list[str] = []


async def refusing_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """/refuse: a limit's 429 (as the rate-limit middleware answers); /echo: 200."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body", False):
        pass
    if scope["path"] == "/refuse":
        error = TooManyRequests("over", kind="requests", retry_after_s=1, limit_headers={})
        await refusals.refuse(error, scope, receive, send)
        return
    served.append(scope["path"])
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(autouse=True)
def refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's refusals come without their random wait (the test makes many)."""
    monkeypatch.setattr(refusals, "REFUSAL_SPREAD_S", 0.0)


def serving(**limits: Any) -> ServerThread:
    options = {"max_connections_per_client": 64, **limits}
    protocol = functools.partial(BoundedHeadProtocol, limits=ClientLimits(**options))
    return ServerThread(refusing_app, http=protocol)


@pytest.fixture
def server() -> Iterator[ServerThread]:
    with serving() as running:
        yield running


def request(path: str, *, close: bool = False) -> bytes:
    connection = "Connection: close\r\n" if close else ""
    return f"POST {path} HTTP/1.1\r\nHost: t\r\n{connection}Content-Length: 0\r\n\r\n".encode()


def opened(server: ServerThread, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", server.port))
    return sock


def refused_times(server: ServerThread, count: int, *, kept_alive: bool = False) -> None:
    """``count`` requests refused by the app: each on a new connection (a client that
    reopens every refused one), or all on one kept-alive connection (an SDK's pool)."""
    if not kept_alive:
        for _ in range(count):
            with opened(server) as sock:
                sock.sendall(request("/refuse", close=True))
                answer = read_until_closed(sock)[0]
                assert error_code(answer) == "rate_limit_exceeded", answer[:200]
        return
    with opened(server) as sock:
        stream = sock.makefile("rb")
        for _ in range(count):
            sock.sendall(request("/refuse"))
            status = stream.readline()
            assert status.startswith(b"HTTP/1.1 429"), status
            length = 0
            while (line := stream.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            stream.read(length)


def answer_to(server: ServerThread, source: str = "127.0.0.1") -> bytes:
    with opened(server, source) as sock:
        sock.sendall(request("/echo", close=True))
        return read_until_closed(sock)[0]


def error_code(answer: bytes) -> str:
    return str(json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"])


def test_an_address_refused_again_and_again_is_turned_away_unread(server: ServerThread) -> None:
    served.clear()
    refused_times(server, HOLD_AFTER)
    answer = answer_to(server)
    assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
    assert b"retry-after: 1" in answer.lower()
    assert error_code(answer) == "too_many_refused_requests"
    assert served == [], "a turned-away connection's request reached the app"
    # Another address (127.0.0.2 reaches the same loopback server) is served.
    assert answer_to(server, "127.0.0.2").startswith(b"HTTP/1.1 200")
    assert served == ["/echo"]


def test_an_address_refused_now_and_then_is_served(server: ServerThread) -> None:
    refused_times(server, HOLD_AFTER - 1)
    assert answer_to(server).startswith(b"HTTP/1.1 200")


def test_a_client_refused_on_kept_alive_connections_is_never_held(server: ServerThread) -> None:
    # An SDK over its limit, retrying on its pool's connections: only a connection's
    # first request counts (and the hold turns away only new connections).
    refused_times(server, 4 * HOLD_AFTER, kept_alive=True)
    assert answer_to(server).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize(
    "limits",
    [{"trusted_proxies": ("127.0.0.0/8",)}, {"max_connections_per_client": 0}],
    ids=["a trusted proxy", "the connection cap off"],
)
def test_no_address_is_held_behind_a_trusted_proxy_or_without_the_cap(
    limits: dict[str, Any],
) -> None:
    with serving(**limits) as server:
        refused_times(server, 2 * HOLD_AFTER)
        assert answer_to(server).startswith(b"HTTP/1.1 200")


def dual_stack(trusted: tuple[str, ...]) -> ServerThread:
    """A server on "::" taking IPv4 too (Linux's default): an IPv4 peer is then named
    "::ffff:127.0.0.1". Proxy headers as ``gateway/cli.py`` sets them."""
    limits = ClientLimits(max_connections_per_client=64, trusted_proxies=trusted)
    server = ServerThread(
        refusing_app,
        http=functools.partial(BoundedHeadProtocol, limits=limits),
        proxy_headers=True,
        forwarded_allow_ips=",".join(with_mapped_forms(trusted)),
    )
    server.sock.close()
    sock = socket.socket(socket.AF_INET6)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::", 0))
    server.sock, server.port = sock, int(sock.getsockname()[1])
    return server


@pytest.mark.parametrize("trusted", [("127.0.0.1",), ("127.0.0.0/8",)])
def test_a_trusted_proxy_on_a_dual_stack_socket_is_never_held(trusted: tuple[str, ...]) -> None:
    served.clear()
    with dual_stack(trusted) as server:
        # Clients behind the proxy (each named in X-Forwarded-For) refused again and again.
        for n in range(HOLD_AFTER):
            with opened(server) as sock:
                forwarded = f"X-Forwarded-For: 203.0.113.{n % 250}\r\n".encode()
                sock.sendall(
                    request("/refuse", close=True).replace(
                        b"\r\n\r\n", b"\r\n" + forwarded + b"\r\n"
                    )
                )
                assert read_until_closed(sock)[0].startswith(b"HTTP/1.1 429")
        # Another client behind the same proxy is served.
        assert answer_to(server).startswith(b"HTTP/1.1 200")
    assert served == ["/echo"]
