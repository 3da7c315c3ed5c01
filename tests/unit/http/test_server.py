"""The bounded httptools protocol (head size, client deadlines, connections per address),
on a real socket (uvicorn in a thread)."""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import socket
import time
import weakref
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from devsupport.servers import ServerThread
from gateway.errors import REFUSAL_SPREAD_S
from gateway.http import server as http_server
from gateway.http.server import (
    BoundedHeadProtocol,
    ClientLimits,
    TrustedProxies,
    client_address,
    with_mapped_forms,
)
from tests.support.waiting import reached, wait_for

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
    with connect(server) as sock:
        for piece in pieces:
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
        return read_until_closed(sock)[0]


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
    assert error_of(answer)["code"] == "headers_too_large"
    assert "huge" not in seen


@pytest.mark.parametrize("byte", [b"\x01", b"\x00", b"\x7f"])
def test_a_head_the_parser_refuses_gets_the_error_envelope(
    server: ServerThread, byte: bytes
) -> None:
    seen.clear()
    request = b"GET /x HTTP/1.1\r\nHost: t\r\nX-Id: bad" + byte + b"id\r\n\r\n"
    answer = exchange(server, [request])
    assert answer.startswith(b"HTTP/1.1 400"), answer[:100]
    assert b"connection: close" in answer
    assert b"content-type: application/json" in answer
    assert error_of(answer)["code"] == "invalid_request"
    assert seen == []


def error_of(answer: bytes) -> dict[str, Any]:
    """The OpenAI error envelope of a raw HTTP answer (all four fields), its error."""
    error: dict[str, Any] = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return error


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


# The bounds on a client's time and connections (ClientLimits), with short deadlines.

HEAD_S, BODY_S, WRITE_S, KEEPALIVE_S, CAP = 0.5, 0.5, 0.5, 0.5, 4
events: list[str] = []


async def limits_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """/echo: the body's size, read at once; /lazy: the body read after 1 s, or after the
    query's seconds (the server pauses reading meanwhile); /endless: 64 KiB chunks until
    the client is gone."""
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/endless":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            for _ in range(100_000):  # ~6 GiB: only a client that reads could take it all
                await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
                if (await _disconnected_now(receive)) is True:
                    break
        finally:
            events.append("endless ended")
        return
    if path == "/lazy":
        await asyncio.sleep(float(scope["query_string"] or 1.0))
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            events.append(f"{path} saw the client leave")
            return
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    events.append(f"{path} read {size}")
    answer = str(size).encode()
    headers = [(b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


async def _disconnected_now(receive: Any) -> bool:
    """Whether the client has left, without waiting (uvicorn answers at once then)."""
    try:
        message = await asyncio.wait_for(receive(), 0.001)
    except TimeoutError:
        return False
    return bool(message["type"] == "http.disconnect")


def limited_server(**limits: Any) -> ServerThread:
    options: dict[str, Any] = {
        "header_timeout_s": HEAD_S,
        "body_timeout_s": BODY_S,
        "write_timeout_s": WRITE_S,
        "max_connections_per_client": CAP,
    }
    options.update(limits)
    protocol = functools.partial(BoundedHeadProtocol, limits=ClientLimits(**options))
    return ServerThread(limits_app, http=protocol, timeout_keep_alive=KEEPALIVE_S)


@pytest.fixture(scope="module")
def limited() -> Iterator[ServerThread]:
    with limited_server() as running:
        yield running


def connect(server: ServerThread) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes; and when it closed (monotonic)."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        received += chunk
    return received, time.monotonic()


def test_a_head_sent_slowly_gets_408_at_its_deadline_however_it_trickles(
    limited: ServerThread,
) -> None:
    with connect(limited) as sock:
        start = time.monotonic()
        # A byte every 0.1 s would take 4 s: every byte arrives well within the deadline
        # of the one before, but the head's deadline runs from its start.
        for byte in b"POST /echo HTTP/1.1\r\nHost: t\r\nX-Slow: 1234567":
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.1)
            if time.monotonic() - start > 2:
                break
        answer, closed = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"code":"request_timeout"' in answer.replace(b" ", b"")
    assert closed - start < 2, "the head's deadline was extended by the trickle"


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(
    limited: ServerThread,
) -> None:
    with connect(limited) as sock:
        start = time.monotonic()
        answer, closed = read_until_closed(sock)
    assert answer == b""
    assert HEAD_S * 0.8 < closed - start < HEAD_S + 2


def test_a_body_that_trickles_gets_408_and_the_app_sees_the_client_leave(
    limited: ServerThread,
) -> None:
    events.clear()
    with connect(limited) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
        start = time.monotonic()
        for _ in range(30):  # 10 bytes every 0.1 s: 1000 bytes would take 10 s
            try:
                sock.sendall(b"b" * 10)
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.1)
            if time.monotonic() - start > 2:
                break
        answer, closed = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert closed - start < 2
    deadline = time.monotonic() + 2
    while "/echo saw the client leave" not in events and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "/echo saw the client leave" in events


def test_a_body_the_app_is_slow_to_take_is_not_the_clients_delay(limited: ServerThread) -> None:
    # /lazy reads nothing for 1 s (twice the body's deadline): the server stops reading
    # once 64 KiB wait, and that wait is not counted against the client.
    body = b"b" * (1 << 20)
    start = f"POST /lazy HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {len(body)}"
    answer = exchange(limited, [start.encode() + b"\r\n\r\n" + body])
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert answer.endswith(str(len(body)).encode())


def test_the_client_gets_a_whole_body_deadline_once_the_app_takes_the_body(
    limited: ServerThread,
) -> None:
    # The app takes the body after 0.8 s; the deadline that passed meanwhile (0.5 s) is
    # not the client's, which then has a whole 0.5 s from when reading resumed: its
    # last bytes at 1.1 s are in time (had the deadline merely moved to 1.0 s, not).
    start = b"POST /lazy?0.8 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
    first, rest = b"b" * (1 << 18), b"b" * 1000
    with connect(limited) as sock:
        sent = time.monotonic()
        sock.sendall(start + b"Content-Length: %d\r\n\r\n" % (len(first) + len(rest)) + first)
        time.sleep(max(0.0, sent + 1.1 - time.monotonic()))
        sock.sendall(rest)
        answer, _ = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert answer.endswith(str(len(first) + len(rest)).encode())


def test_kept_alive_requests_are_served_then_an_idle_connection_is_closed(
    limited: ServerThread,
) -> None:
    with connect(limited) as sock:
        for n in range(3):
            request = f"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {n}\r\n\r\n"
            sock.sendall(request.encode() + b"b" * n)
            answer = b""
            while not answer.endswith(b"\r\n\r\n" + str(n).encode()):
                chunk = sock.recv(65536)
                assert chunk, answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200")
            if n < 2:
                time.sleep(KEEPALIVE_S * 0.6)  # idle between requests: under keep-alive's limit
        start = time.monotonic()
        rest, closed = read_until_closed(sock)
    assert rest == b""
    assert KEEPALIVE_S * 0.8 < closed - start < KEEPALIVE_S + 2


def test_past_the_cap_a_client_address_gets_429_and_others_are_still_served() -> None:
    # The held connections send nothing: a head deadline of its own keeps them open
    # until the test closes them (at HEAD_S the server would close them first).
    with limited_server(header_timeout_s=60) as server:
        held = [connect(server) for _ in range(CAP)]
        try:
            wait_for(lambda: server.connections == CAP, 5, "the held connections made")
            with connect(server) as extra:
                refused, _ = read_until_closed(extra)
            assert refused.startswith(b"HTTP/1.1 429"), refused[:200]
            assert b"retry-after: 1" in refused.lower()
            assert b"too_many_connections" in refused
            # Another address (127.0.0.2 reaches the same loopback server) is not capped.
            with socket.socket() as other:
                other.bind(("127.0.0.2", 0))
                other.settimeout(5)
                other.connect(("127.0.0.1", server.port))
                other.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
                assert other.recv(65536).startswith(b"HTTP/1.1 200")
        finally:
            held.pop().close()
        # The close reaches the server (and the refused and other connections are gone):
        # a place is free again.
        wait_for(lambda: server.connections < CAP, 5, "the closed connection lost")
        try:
            answer = exchange(server, [head("again")])
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        finally:
            for sock in held:
                sock.close()


def test_a_burst_past_the_cap_is_refused_whole_and_no_refused_request_reaches_the_app() -> None:
    """Refusals are spread over up to ``REFUSAL_SPREAD_S`` and paced over loop turns
    (http_server._refuse_spread); meanwhile what a refused client sends is not read:
    its request must never run, and the connections within the cap are served."""
    events.clear()
    # More than may wait out the spread: the rest are answered at once, paced.
    count = http_server.SPREAD_REFUSALS + 5 * http_server.REFUSALS_PER_TURN
    # The held connections send only after the burst is made: on a loaded machine that
    # took longer than HEAD_S, and the head deadline closed them (not this test's point).
    with limited_server(header_timeout_s=30) as server:
        held = [connect(server) for _ in range(CAP)]
        burst = [connect(server) for _ in range(count)]
        try:
            for sock in burst:
                sock.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 7\r\n\r\nrefused")
            held[0].sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nheld")
            assert held[0].recv(65536).startswith(b"HTTP/1.1 200")
            started = time.monotonic()
            answers = [read_until_closed(sock)[0] for sock in burst]
            assert all(a.startswith(b"HTTP/1.1 429") for a in answers), {a[:30] for a in answers}
            assert time.monotonic() - started < REFUSAL_SPREAD_S + 2
        finally:
            for sock in held + burst:
                sock.close()
    assert "/echo read 4" in events
    assert "/echo read 7" not in events, "a refused connection's request was served"


def test_trusted_proxies_are_not_capped() -> None:
    with limited_server(trusted_proxies=("127.0.0.0/8",)) as server:
        held = [connect(server) for _ in range(CAP + 2)]
        try:
            sock = held[-1]
            sock.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        finally:
            for sock in held:
                sock.close()


def test_a_client_that_stops_reading_is_cut_off_and_the_app_sees_it_leave(
    limited: ServerThread,
) -> None:
    events.clear()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
        sock.settimeout(5)
        sock.connect(("127.0.0.1", limited.port))
        sock.sendall(b"GET /endless HTTP/1.1\r\nHost: t\r\n\r\n")
        start = time.monotonic()
        deadline = start + 5
        while "endless ended" not in events and time.monotonic() < deadline:
            time.sleep(0.02)
        ended = time.monotonic()
        assert "endless ended" in events, "the app went on sending to a client that reads nothing"
        assert ended - start < WRITE_S + 3
        # What was sent before the cut is there to read, then the connection is gone.
        received, _ = read_until_closed(sock)
    assert received.startswith(b"HTTP/1.1 200")
    assert len(received) < 64 << 20


def test_a_trusted_proxy_is_trusted_as_the_ipv4_mapped_peer_of_a_dual_stack_socket() -> None:
    trusted = TrustedProxies(("127.0.0.0/8", "10.1.2.3"))
    assert "::ffff:127.0.0.1" in trusted and "::ffff:10.1.2.3" in trusted
    assert "::ffff:10.1.2.4" not in trusted and "10.1.2.4" not in trusted
    assert with_mapped_forms(("10.0.0.0/8", "fd00::/8", "proxy")) == (
        "10.0.0.0/8",
        "fd00::/8",
        "proxy",
        "::ffff:10.0.0.0/104",
    )


def test_the_client_address_groups_ipv6_by_its_64_and_unmaps_ipv4() -> None:
    assert client_address("203.0.113.7") == "203.0.113.7"
    assert client_address("2001:db8:1:2:aaaa::1") == client_address("2001:db8:1:2:bbbb::9")
    assert client_address("2001:db8:1:2::1") != client_address("2001:db8:1:3::1")
    assert client_address("::ffff:203.0.113.7") == "203.0.113.7"
    assert "10.1.2.3" in TrustedProxies(("10.0.0.0/8",))
    assert "11.0.0.1" not in TrustedProxies(("10.0.0.0/8",))
    assert "anything" in TrustedProxies(("*",)) and "10.1.2.3" not in TrustedProxies(())
    assert "proxy.internal" in TrustedProxies(("proxy.internal",))
    assert "fe80::1%eth0" in ClientLimits(trusted_proxies=("fe80::/64",)).trusted


class _Watched(BoundedHeadProtocol):
    """Keeps a weak reference to each of its connections."""

    made: ClassVar[list[weakref.ref[BoundedHeadProtocol]]] = []

    def connection_made(self, transport: Any) -> None:
        _Watched.made.append(weakref.ref(self))
        super().connection_made(transport)


def test_a_closed_connection_is_freed_at_once_not_left_to_the_garbage_collector() -> None:
    """A connection that leaves a reference cycle behind is freed only by a collection,
    which then walks all of them at once: at 600 refused connections a second, a 100 ms
    stall every few seconds for every client (bench/abuse.py)."""
    _Watched.made.clear()
    with ServerThread(echo_app, http=_Watched) as running:
        gc.collect()
        gc.disable()  # only reference counting frees anything now
        try:
            for i in range(20):
                assert exchange(running, [head(f"c{i}")]).endswith(f"c{i}:0".encode())
            wait_for(lambda: len(_Watched.made) == 20 and running.connections == 0)
            # The last one's request task may end a moment after its connection.
            freed = reached(lambda: all(ref() is None for ref in _Watched.made), timeout=2)
            alive = sum(ref() is not None for ref in _Watched.made)
        finally:
            gc.enable()
    assert freed, f"{alive} of 20 closed connections wait for the collector"
