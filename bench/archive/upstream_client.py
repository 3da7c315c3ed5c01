"""Which HTTP client can carry the gateway's hot path? One run, every candidate, one table.

Three processes per candidate, all local and real sockets:

* a fast upstream (raw asyncio, uvloop when installed, so it is never the bottleneck) that
  answers ``POST /v1/chat/completions?chunks=N&ms=M`` with an SSE stream of N events M ms
  apart (chunked transfer encoding, keep-alive);
* a minimal relay in the gateway's style (Starlette under uvicorn with h11 on the plain
  asyncio loop, as ``memory-gateway serve`` runs): read the body, open the upstream with
  the candidate client, stream the answer back;
* the load generator (this process, aiohttp): N concurrent clients, each sending stream
  after stream for ``--seconds``; then, at concurrency 1, the time to the first SSE event
  through the relay minus the same straight to the upstream (requests alternate, so a
  noisy neighbour hits both sides alike).

Candidates (``--clients``): ``httpx`` (one AsyncClient, default limits), ``httpx-tuned``
(``--shards`` AsyncClients round-robin, HTTP/1.1, pool sized for the load;
``httpx-tuned/16`` names its own shard count), ``aiohttp``
(one ClientSession, no connection limit), ``gateway`` (``gateway.upstream.client.Upstream``
as the gateway builds it: whatever client that module uses today).

    .venv/bin/python bench/archive/upstream_client.py   # ~2 minutes
    .venv/bin/python bench/archive/upstream_client.py --streams 256 --seconds 4 \
        --clients httpx,aiohttp

Numbers are wall-clock on whatever machine runs it, and every process shares its cores:
compare the rows of one run, not runs on different days.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ("httpx", "httpx-tuned", "aiohttp", "gateway")
HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}

# --- the upstream -------------------------------------------------------------------


def _event(index: int) -> bytes:
    data = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"delta": {"content": "tok"}}],
    }
    data["choices"][0]["index"] = index
    line = b"data: " + json.dumps(data).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(line), line)


_DONE = b"data: [DONE]\n\n"
_LAST = b"%x\r\n%s\r\n0\r\n\r\n" % (len(_DONE), _DONE)
_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
)


_STREAMS: set[asyncio.Future[None]] = set()


class _UpstreamProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive, just enough of it: one request at a time per connection."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: Any = None  # uvloop's transport is not an asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            query = parse_qs(urlsplit(head[0].split(" ")[1]).query)
            chunks = int(query.get("chunks", ["8"])[0])
            interval = float(query.get("ms", ["100"])[0]) / 1000
            task = asyncio.ensure_future(self._stream(chunks, interval))
            _STREAMS.add(task)  # a task nobody holds may be collected mid-stream
            task.add_done_callback(_STREAMS.discard)

    async def _stream(self, chunks: int, interval: float) -> None:
        transport = self.transport
        assert transport is not None
        transport.write(_HEAD + _event(0))
        for index in range(1, chunks):
            if interval:
                await asyncio.sleep(interval)
            if transport.is_closing():
                return
            transport.write(_event(index))
        transport.write(_LAST)


async def _serve_upstream(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_UpstreamProtocol, "127.0.0.1", port, backlog=4096)
    await server.serve_forever()


# --- the relay and its candidate clients ---------------------------------------------

Opened = tuple[int, list[tuple[str, str]], AsyncIterator[bytes], Callable[[], Awaitable[None]]]


async def _httpx_opener(shards: int, connections: int) -> Callable[..., Awaitable[Opened]]:
    import httpx

    limits = httpx.Limits(
        max_connections=max(1, connections // shards),
        max_keepalive_connections=max(1, connections // shards),
    )
    tuned = connections > 0
    clients = [
        httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(retries=0, http1=True, http2=False, limits=limits)
            if tuned
            else None,
            timeout=httpx.Timeout(connect=5, read=None, write=30, pool=5),
        )
        for _ in range(shards)
    ]
    ring = itertools.cycle(clients)

    async def open_(method: str, url: str, headers: list[tuple[str, str]], body: bytes) -> Opened:
        client = next(ring)
        request = client.build_request(method, url, headers=headers, content=body)
        response = await client.send(request, stream=True)
        return (
            response.status_code,
            list(response.headers.multi_items()),
            response.aiter_raw(),
            response.aclose,
        )

    return open_


async def _aiohttp_opener() -> Callable[..., Awaitable[Opened]]:
    import aiohttp

    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
        timeout=aiohttp.ClientTimeout(total=None, connect=5, sock_read=None),
    )

    async def open_(method: str, url: str, headers: list[tuple[str, str]], body: bytes) -> Opened:
        response = await session.request(
            method, url, headers=headers, data=body, allow_redirects=False
        )

        async def close() -> None:
            response.release()

        return (
            response.status,
            list(response.headers.items()),
            response.content.iter_any(),
            close,
        )

    return open_


async def _gateway_opener(base_url: str) -> Callable[..., Awaitable[Opened]]:
    sys.path.insert(0, str(ROOT))
    from gateway.config import UpstreamConfig
    from gateway.upstream.client import Upstream

    upstream = Upstream(UpstreamConfig(base_url=base_url + "/v1"))

    async def open_(method: str, url: str, headers: list[tuple[str, str]], body: bytes) -> Opened:
        parts = urlsplit(url)
        response = await upstream.open(
            method, parts.path, query=parts.query.encode(), headers=headers, content=body
        )
        return (
            response.status_code,
            response.headers,
            response.iter_body(decoded=True),
            response.aclose,
        )

    return open_


def _serve_relay(client: str, port: int, upstream: str, shards: int, connections: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    opener: dict[str, Callable[..., Awaitable[Opened]]] = {}

    async def relay(request: Request) -> Response:
        body = await request.body()
        headers = [(k, v) for k, v in request.headers.items() if k not in HOP_BY_HOP]
        query = request.scope["query_string"].decode()
        url = upstream + request.url.path + ("?" + query if query else "")
        try:
            status, received, chunks, close = await opener["open"](
                request.method, url, headers, body
            )
        except Exception as error:  # counted by the load generator, not logged 10,000 times
            return Response(type(error).__name__.encode(), status_code=502)

        async def body_iter() -> AsyncIterator[bytes]:
            try:
                async for chunk in chunks:
                    yield chunk
            finally:
                await close()

        response = StreamingResponse(body_iter(), status_code=status)
        response.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in received
            if k.lower() not in HOP_BY_HOP
        ]
        return response

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if client == "aiohttp":
            opener["open"] = await _aiohttp_opener()
        elif client == "gateway":
            opener["open"] = await _gateway_opener(upstream)
        elif client.startswith("httpx-tuned"):
            # "httpx-tuned/16": 16 clients; "httpx-tuned": --shards clients.
            count = int(client.partition("/")[2] or shards)
            opener["open"] = await _httpx_opener(count, connections)
        else:
            opener["open"] = await _httpx_opener(1, 0)
        yield

    app = Starlette(routes=[Route("/{path:path}", relay, methods=["POST"])], lifespan=lifespan)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http="h11", log_level="warning", backlog=4096
    )
    asyncio.run(uvicorn.Server(config).serve())


# --- the load generator ----------------------------------------------------------------


@dataclass
class LoadResult:
    ok: int
    timeouts: int
    errors: int
    seconds: float
    durations: list[float]

    @property
    def rate(self) -> float:
        return self.ok / self.seconds


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _load(url: str, streams: int, seconds: float, chunks: int, ms: int) -> LoadResult:
    import aiohttp

    payload = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user"}]})
    target = f"{url}/v1/chat/completions?chunks={chunks}&ms={ms}"
    durations: list[float] = []
    counts = {"ok": 0, "timeouts": 0, "errors": 0}
    deadline = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one_client() -> None:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    async with asyncio.timeout(10):
                        async with session.post(
                            target, data=payload, headers={"content-type": "application/json"}
                        ) as response:
                            body = await response.read()
                    outcome = "ok" if response.status == 200 and body.endswith(_DONE) else "errors"
                except TimeoutError:
                    outcome = "timeouts"
                except aiohttp.ClientError:
                    outcome = "errors"
                counts[outcome] += 1
                if outcome == "ok":
                    durations.append(time.perf_counter() - started)
                else:
                    await asyncio.sleep(0.05)  # a refused connect must not spin

        begun = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(streams)))
        elapsed = time.perf_counter() - begun
    return LoadResult(counts["ok"], counts["timeouts"], counts["errors"], elapsed, durations)


async def _first_event_ms(session: Any, url: str) -> float:
    started = time.perf_counter()
    async with session.post(
        f"{url}/v1/chat/completions?chunks=2&ms=0", data=b'{"stream": true}'
    ) as response:
        await response.content.readuntil(b"\n\n")
        first = time.perf_counter() - started
        await response.read()
    return first * 1000


async def _added_latency(direct: str, relay: str, requests: int) -> tuple[float, float]:
    import aiohttp

    straight: list[float] = []
    relayed: list[float] = []
    async with aiohttp.ClientSession() as session:
        for _ in range(20):  # warm both paths' connections
            await _first_event_ms(session, direct)
            await _first_event_ms(session, relay)
        for _ in range(requests):
            straight.append(await _first_event_ms(session, direct))
            relayed.append(await _first_event_ms(session, relay))
    p50 = statistics.median(relayed) - statistics.median(straight)
    p99 = _percentile(relayed, 0.99) - _percentile(straight, 0.99)
    return p50, p99


# --- orchestration -----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start(args: list[str], port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, __file__, *args], cwd=ROOT)
    for _ in range(200):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
            return process
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{args} did not start listening on {port}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _run(options: argparse.Namespace) -> None:
    upstream_port = _free_port()
    upstream = _start(["--serve-upstream", str(upstream_port)], upstream_port)
    direct = f"http://127.0.0.1:{upstream_port}"
    streams = [int(n) for n in options.streams.split(",")]
    rows: list[list[str]] = []
    try:
        for client in options.clients.split(","):
            port = _free_port()
            relay_args = ["--serve-relay", client, str(port), direct]
            relay_args += ["--shards", str(options.shards), "--connections", str(max(streams))]
            relay = _start(relay_args, port)
            url = f"http://127.0.0.1:{port}"
            try:
                p50, p99 = asyncio.run(_added_latency(direct, url, options.latency_requests))
                cells = [client, f"{p50:.2f}", f"{p99:.2f}"]
                for count in streams:
                    result = asyncio.run(
                        _load(url, count, options.seconds, options.chunks, options.ms)
                    )
                    cells += [
                        f"{result.rate:.0f}",
                        f"{result.timeouts}/{result.errors}",
                        f"{_percentile(result.durations, 0.99):.2f}",
                    ]
                rows.append(cells)
                print("  " + " | ".join(cells), file=sys.stderr)
            finally:
                _stop(relay)
    finally:
        _stop(upstream)
    ideal = (options.chunks - 1) * options.ms / 1000
    header = ["client", "added p50 ms", "added p99 ms"]
    for count in streams:
        header += [f"{count} streams req/s", f"{count}: timeouts/errors", f"{count}: p99 s"]
    print(
        f"\n{options.chunks}-event streams of {ideal:g} s; {options.seconds:g} s per load; "
        f"ideal req/s = streams / {ideal:g}; latency over {options.latency_requests} requests\n"
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--streams", default="256,1024", help="concurrent streams, comma-separated")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each load")
    parser.add_argument("--chunks", type=int, default=8, help="SSE events per stream")
    parser.add_argument("--ms", type=int, default=100, help="gap between events")
    parser.add_argument("--shards", type=int, default=4, help="AsyncClients for httpx-tuned")
    parser.add_argument("--connections", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--latency-requests", type=int, default=400)
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-relay", nargs=3, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve_upstream:
        with contextlib.suppress(ImportError):
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        asyncio.run(_serve_upstream(options.serve_upstream))
    elif options.serve_relay:
        client, port, upstream = options.serve_relay
        _serve_relay(client, int(port), upstream, options.shards, options.connections)
    else:
        with contextlib.suppress(ImportError):
            import uvloop  # the load generator must not be the bottleneck

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        _run(options)


if __name__ == "__main__":
    main()
