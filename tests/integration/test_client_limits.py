"""The client edge of a whole gateway, served with ``serve``'s own options (http/server.py):
read and write deadlines, the cap on one address's connections, one Date and one Server
header, and Allow on every 405. Real sockets, a real Redis, a real upstream."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from devsupport.gateways import build_settings
from devsupport.servers import RedisProcess, ServerThread
from gateway.cli import _server_options
from gateway.config import Settings
from gateway.wiring import build_clients
from tests.support.processes import Served
from tests.support.waiting import wait_for


def serve_in_thread(settings: Settings) -> ServerThread:
    """The gateway as ``memory-gateway serve`` runs it (protocol, limits, keep-alive),
    logging left as the tests set it up."""
    clients = build_clients(settings, settings.redis.url)
    options = _server_options(settings, "127.0.0.1", 0)
    for test_owned in ("host", "port", "log_config", "log_level"):
        del options[test_owned]
    return ServerThread(clients.create_app(settings), on_stop=clients.aclose, **options).start()


@pytest.fixture
def edge_gateway(upstream_url: str, redis_server: RedisProcess) -> Iterator[Any]:
    started: list[ServerThread] = []

    def make(base_url: str = upstream_url, **server: Any) -> ServerThread:
        settings = build_settings(base_url, redis_server.url, server=server)
        started.append(serve_in_thread(settings))
        return started[-1]

    yield make
    for thread in started:
        thread.stop()


def read_until_closed(sock: socket.socket) -> bytes:
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        received += chunk
    return received


# A streaming client that stops reading.


class EndlessUpstream:
    """/v1/chat/completions: an SSE stream that never ends (``endless``) or one short
    JSON answer (any other model). Records when an endless stream was given up."""

    def __init__(self) -> None:
        self.streams_started = 0
        self.streams_ended: list[float] = []

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        if body.get("model") == "trickle":
            return StreamingResponse(self.trickle(), media_type="text/event-stream")
        if body.get("model") != "endless":
            return JSONResponse(
                {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                 "choices": [{"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": "short"}}]}
            )  # fmt: skip
        return StreamingResponse(self.stream(), media_type="text/event-stream")

    async def trickle(self) -> AsyncIterator[bytes]:
        """~30 KB/s, forever: far too slow to fill the gateway's 1 MiB send buffer."""
        self.streams_started += 1
        delta = {"content": "word " * 300}  # ~1.5 KB an event
        event = f"data: {json.dumps({'choices': [{'index': 0, 'delta': delta}]})}\n\n".encode()
        try:
            while True:
                yield event
                await asyncio.sleep(0.05)
        finally:
            self.streams_ended.append(time.monotonic())

    async def stream(self) -> AsyncIterator[bytes]:
        self.streams_started += 1
        delta = {"content": "word " * 1600}  # 8 KiB an event
        event = f"data: {json.dumps({'choices': [{'index': 0, 'delta': delta}]})}\n\n".encode()
        try:
            while True:
                yield event
                await asyncio.sleep(0)
        finally:
            self.streams_ended.append(time.monotonic())


@pytest.fixture(scope="module")
def endless() -> Iterator[tuple[EndlessUpstream, str]]:
    upstream = EndlessUpstream()
    with ServerThread(upstream.app()) as thread:
        yield upstream, thread.url + "/v1"


def test_a_streaming_client_that_stops_reading_loses_its_upstream_stream(
    edge_gateway: Any, endless: tuple[EndlessUpstream, str], api_key: str, session_id: str
) -> None:
    upstream, url = endless
    gateway = edge_gateway(url, client_write_timeout_s=1.0)
    body = json.dumps(
        {"model": "endless", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    ).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {api_key}\r\n"
        f"X-Session-Id: {session_id}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    ended_before = len(upstream.streams_ended)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # full at once
        sock.settimeout(10)
        sock.connect(("127.0.0.1", gateway.port))
        sock.sendall(request)
        start = time.monotonic()
        # Reads nothing: the gateway's buffers fill, then its write deadline passes.
        deadline = start + 10
        while len(upstream.streams_ended) == ended_before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(upstream.streams_ended) > ended_before, "the upstream stream was never closed"
        assert upstream.streams_ended[-1] - start < 1.0 + 5
        # The connection was cut: what was sent before is there, then its end.
        received = read_until_closed(sock)
        assert received.startswith(b"HTTP/1.1 200")
    # The gateway serves others meanwhile and after.
    answer = httpx.post(
        gateway.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id + "-b"},
        json={"model": "short", "messages": [{"role": "user", "content": "hello"}]},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "short"


def _stream_request(api_key: str, session_id: str, model: str) -> bytes:
    body = json.dumps(
        {"model": model, "stream": True, "messages": [{"role": "user", "content": "go"}]}
    ).encode()
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {api_key}\r\n"
        f"X-Session-Id: {session_id}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def test_a_client_that_reads_nothing_of_a_trickling_stream_is_cut_off(
    edge_gateway: Any, endless: tuple[EndlessUpstream, str], api_key: str, session_id: str
) -> None:
    # The stream is far too slow to fill the send buffer the write deadline waits for;
    # what the client takes of it is what tells.
    upstream, url = endless
    gateway = edge_gateway(url, client_write_timeout_s=0.5, client_min_read_bytes_s=100_000)
    ended_before = len(upstream.streams_ended)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", gateway.port))
        sock.sendall(_stream_request(api_key, session_id, "trickle"))
        start = time.monotonic()
        wait_for(lambda: len(upstream.streams_ended) > ended_before, 10.0)
        # Two looks (0.5 s apart) and the cut, well before the send buffer could fill.
        assert upstream.streams_ended[-1] - start < 5
        assert read_until_closed(sock).startswith(b"HTTP/1.1 200")


def test_a_client_that_keeps_up_with_a_slow_stream_is_not_cut_off(
    edge_gateway: Any, endless: tuple[EndlessUpstream, str], api_key: str, session_id: str
) -> None:
    # It takes everything it is sent, at the upstream's 30 KB/s: under the minimum rate,
    # but nothing waits for it.
    upstream, url = endless
    gateway = edge_gateway(url, client_write_timeout_s=0.3, client_min_read_bytes_s=100_000)
    ended_before = len(upstream.streams_ended)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(_stream_request(api_key, session_id, "trickle"))
        received, until = 0, time.monotonic() + 2.0  # six looks and more
        while time.monotonic() < until:
            chunk = sock.recv(65536)
            assert chunk, "the gateway closed a connection that kept up"
            received += len(chunk)
    assert received > 30_000
    assert len(upstream.streams_ended) == ended_before or upstream.streams_ended[-1] > until


# Read deadlines, through the options ``serve`` passes.


def test_a_slow_request_head_gets_408_in_openais_shape(edge_gateway: Any) -> None:
    gateway = edge_gateway(header_timeout_s=0.5)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        start = time.monotonic()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n")  # and no more
        answer = read_until_closed(sock)
        closed = time.monotonic()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "request_timeout"
    assert closed - start < 5


@pytest.mark.parametrize("session", [True, False], ids=["remembered", "passed through"])
def test_a_body_that_trickles_gets_408(
    edge_gateway: Any, api_key: str, session_id: str, session: bool, log_capture: Any
) -> None:
    gateway = edge_gateway(body_timeout_s=0.5)
    logged = len(log_capture.records)
    remembered = f"X-Session-Id: {session_id}\r\n" if session else ""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {api_key}\r\n{remembered}Content-Length: 5000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"model": "fake-model", ')  # and no more
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    wait_for(lambda: gateway.requests_running == 0, 5, "the app done with the request")
    errors = [line for level, line in log_capture.records[logged:] if level >= logging.ERROR]
    assert not errors, errors  # a client that left is no error of the gateway's


# One address's connections.


def test_a_thousand_idle_sockets_from_one_address_leave_others_served(
    tmp_path: Path, upstream_url: str, redis_server: RedisProcess
) -> None:
    """1,100 idle sockets against a gateway of 1,024 descriptors: without the cap, it
    could accept no one else."""
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"upstream:\n  base_url: {upstream_url}\n"
        f"redis:\n  url: {redis_server.url}\n"
        "server:\n  max_connections_per_client: 100\n  header_timeout_s: 60\n"
    )
    served = Served(config)
    attack: list[socket.socket] = []
    try:
        resource.prlimit(served.process.pid, resource.RLIMIT_NOFILE, (1024, 1024))
        for _ in range(1100):
            sock = socket.socket()
            sock.bind(("127.0.0.2", 0))  # another client address on the same loopback
            sock.settimeout(5)
            sock.connect(("127.0.0.1", served.port))
            attack.append(sock)
        # The gateway has accepted (and counted or refused) them all: none left waiting.
        wait_for(lambda: waiting_to_be_accepted(served.port) == 0, 10, "the sockets accepted")
        with httpx.Client(base_url=served.url, timeout=5) as client:
            for _ in range(20):
                assert client.get("/healthz").status_code == 200
                # A new connection each time: the gateway must still be able to accept.
                with httpx.Client(base_url=served.url, timeout=5) as fresh:
                    assert fresh.get("/healthz").status_code == 200
        refused = 0
        for sock in attack:
            sock.settimeout(0.01)
            try:
                if sock.recv(100).startswith(b"HTTP/1.1 429"):
                    refused += 1
            except (TimeoutError, ConnectionResetError):
                pass
        assert refused >= 900, refused
    finally:
        for sock in attack:
            sock.close()
        served.stop()


def waiting_to_be_accepted(port: int) -> int | None:
    """Connections the kernel has made to the listening socket on ``port`` that the
    server has not accepted yet (a listening socket's rx_queue in /proc/net/tcp); None
    when no socket listens there."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                local, _, state, queues = row.split()[1:5]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # LISTEN
                    return int(queues.split(":")[1], 16)
    return None


# Headers.


def test_proxied_and_own_responses_carry_one_date_and_one_server(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    auth = {"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id}
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "hello there"}]}
    with httpx.Client(base_url=gateway.url, headers=auth, timeout=10) as client:
        answers = [
            client.get("/v1/models"),  # the passthrough
            client.post("/v1/chat/completions", json=chat),  # remembered, not streamed
            client.post("/v1/chat/completions", json={**chat, "stream": True}),  # streamed
            client.get("/healthz"),  # the gateway's own
        ]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert len(answer.headers.get_list("date")) == 1, answer.headers
        assert len(answer.headers.get_list("server")) == 1, answer.headers


def test_every_405_says_which_methods_are_allowed(gateway: ServerThread, api_key: str) -> None:
    auth = {"Authorization": f"Bearer {api_key}"}
    cases = [
        ("GET", "/v1/chat/completions", "POST"),  # the memory route takes POST only
        ("GET", "/v1/admin/delete-all", ""),  # not passed upstream at all: no method
        ("POST", "/healthz", "GET, HEAD"),
        ("PUT", "/memory/sessions/s-1", "DELETE, GET, HEAD"),  # a route per method
    ]
    for method, path, allowed in cases:
        answer = httpx.request(method, gateway.url + path, headers=auth, timeout=10)
        assert answer.status_code == 405, (method, path, answer.text)
        assert "allow" in answer.headers, (method, path)
        assert answer.headers["allow"] == allowed, (method, path)
        assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
