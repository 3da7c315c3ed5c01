"""The upstream client, against a scripted upstream on a real local socket."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from gateway.config import UpstreamConfig, UpstreamTimeouts
from gateway.errors import InvalidRequest, UpstreamPoolFull, UpstreamTimeout, UpstreamUnreachable
from gateway.upstream.body import UpstreamStreamBroken
from gateway.upstream.client import Upstream
from tests.support.local_upstream import (
    RESET,
    LocalUpstream,
    Script,
    eventually,
    local_upstream,
    ok,
)


def config(base_url: str, *, max_connections: int = 512, **timeouts: float) -> UpstreamConfig:
    return UpstreamConfig(
        base_url=base_url, max_connections=max_connections, timeouts=UpstreamTimeouts(**timeouts)
    )


async def fetch(upstream: Upstream, path: str = "/v1/models", **kwargs: Any) -> tuple[int, bytes]:
    kwargs.setdefault("headers", [])
    kwargs.setdefault("content", b"")
    response = await upstream.open(kwargs.pop("method", "GET"), path, **kwargs)
    try:
        return response.status_code, await response.read()
    finally:
        await response.aclose()


@pytest.fixture
async def server() -> AsyncIterator[LocalUpstream]:
    async with local_upstream() as running:
        yield running


@pytest.fixture
async def upstream(server: LocalUpstream) -> AsyncIterator[Upstream]:
    client = Upstream(config(server.base_url))
    yield client
    await client.aclose()


@pytest.mark.parametrize(
    ("base_url", "path", "expected"),
    [
        ("http://up.test/v1", "/v1/models", "http://up.test/v1/models"),
        ("http://up.test/v1/", "/v1/models", "http://up.test/v1/models"),
        ("http://up.test/v1", "/v1/chat/completions", "http://up.test/v1/chat/completions"),
        ("http://up.test/v1", "/v1", "http://up.test/v1"),
        ("http://up.test/v1", "/models", "http://up.test/v1/models"),
        ("http://up.test/v1", "/v1beta/models", "http://up.test/v1/v1beta/models"),
        ("http://localhost:11434/api/", "/v1/embeddings", "http://localhost:11434/api/embeddings"),
        ("https://up.test", "/v1/models", "https://up.test/models"),
        ("https://up.test/openai/v1", "/v1/files/f-1", "https://up.test/openai/v1/files/f-1"),
    ],
)
def test_url_mapping(base_url: str, path: str, expected: str) -> None:
    assert Upstream(config(base_url)).url(path) == expected


async def test_the_mapped_path_is_what_the_upstream_receives(server: LocalUpstream) -> None:
    upstream = Upstream(config(f"http://127.0.0.1:{server.port}/openai/v1/"))
    try:
        assert await fetch(upstream, "/v1/files/f-1") == (200, b"ok")
        assert await fetch(upstream, "/v1/files/a b") == (200, b"ok")  # decoded by ASGI
    finally:
        await upstream.aclose()
    assert [seen.target for seen in server.seen] == [
        "/openai/v1/files/f-1",
        "/openai/v1/files/a%20b",
    ]


@pytest.mark.parametrize(
    "query",
    [
        b"a=1&b=2",
        b"order=desc&after=file-%2Fabc&limit=20",
        b"q=a|b&r=[1]&s=%e2%82%ac&t=&u&c=%3D%26",
        b"k=a/b?c:d@e!$'()*,;x=%7e&y=%7E&z=c+d",
    ],
)
async def test_raw_query_is_preserved_byte_for_byte(
    server: LocalUpstream, upstream: Upstream, query: bytes
) -> None:
    await fetch(upstream, "/v1/files", query=query)
    assert server.seen[0].target == "/v1/files?" + query.decode()


async def test_no_query_sends_no_question_mark(server: LocalUpstream, upstream: Upstream) -> None:
    await fetch(upstream, "/v1/models")
    assert server.seen[0].target == "/v1/models"


async def test_set_cookie_is_never_replayed(server: LocalUpstream, upstream: Upstream) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.Response(body=b"one" if len(server.seen) == 1 else b"two")
        if len(server.seen) == 1:
            response.headers["Set-Cookie"] = "sid=secret; Path=/"
        return response

    server.handler = handler
    first = await upstream.open("GET", "/v1/models", headers=[], content=b"")
    # The client still sees the upstream's Set-Cookie (it is its business) ...
    assert ("set-cookie", "sid=secret; Path=/") in first.headers
    assert await first.read() == b"one"
    await first.aclose()
    assert await fetch(upstream, "/v1/models") == (200, b"two")
    # ... but the gateway neither keeps it nor sends it for the next client.
    assert server.seen[1].header_values("cookie") == []
    assert len(upstream.client.cookie_jar) == 0


async def test_client_cookie_header_is_forwarded(server: LocalUpstream, upstream: Upstream) -> None:
    await fetch(upstream, headers=[("Cookie", "mine=1")])
    assert server.seen[0].header_values("cookie") == [b"mine=1"]


async def test_redirects_are_not_followed(server: LocalUpstream, upstream: Upstream) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=302, headers={"Location": server.base_url + "/elsewhere"})

    server.handler = handler
    response = await upstream.open("POST", "/v1/chat/completions", headers=[], content=b"{}")
    assert response.status_code == 302
    assert ("location", server.base_url + "/elsewhere") in response.headers
    await response.aclose()
    assert len(server.seen) == 1


async def test_only_the_clients_headers_are_sent(server: LocalUpstream, upstream: Upstream) -> None:
    await fetch(upstream, method="POST", headers=[("X-Custom", "1")], content=b"{}")
    await fetch(upstream, headers=[("User-Agent", "my-app/2"), ("Accept", "text/plain")])
    bare, explicit = server.seen
    for name in ("user-agent", "accept-encoding", "accept", "content-type"):
        assert bare.header_values(name) == [], name
    assert bare.header_values("x-custom") == [b"1"]
    assert bare.header_values("host") == [f"127.0.0.1:{server.port}".encode()]
    assert bare.header_values("content-length") == [b"2"]  # framing, not a client header
    assert explicit.header_values("user-agent") == [b"my-app/2"]
    assert explicit.header_values("accept") == [b"text/plain"]
    assert explicit.header_values("accept-encoding") == []
    assert explicit.header_values("content-length") == []  # a GET without a body


async def test_non_ascii_header_bytes_are_sent_as_they_came(
    server: LocalUpstream, upstream: Upstream
) -> None:
    sent = "café 会話".encode()
    # The ASGI server hands header bytes over decoded as latin-1.
    await fetch(upstream, headers=[("X-Note", sent.decode("latin-1"))])
    assert server.seen[0].header_values("x-note") == [sent]


async def test_a_header_that_is_not_utf8_is_refused_not_altered(
    server: LocalUpstream, upstream: Upstream
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        await fetch(upstream, headers=[("X-Note", b"caf\xe9".decode("latin-1"))])
    assert caught.value.status == 400
    assert "X-Note" in caught.value.message
    assert server.seen == []


async def test_method_body_and_repeated_headers_are_sent(
    server: LocalUpstream, upstream: Upstream
) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b'{"model":'
        yield b'"m"}'

    await fetch(
        upstream,
        "/v1/chat/completions",
        method="POST",
        headers=[("X-Multi", "a"), ("X-Multi", "b")],
        content=body(),
    )
    await fetch(upstream, "/v1/files/f", method="DELETE")
    post, delete = server.seen
    assert post.method == "POST"
    assert post.body == b'{"model":"m"}'
    assert post.header_values("x-multi") == [b"a", b"b"]
    assert post.header_values("transfer-encoding") == [b"chunked"]  # streamed as it came
    assert delete.method == "DELETE"


async def test_response_status_and_repeated_headers_are_returned(
    server: LocalUpstream, upstream: Upstream
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.Response(status=429, body=b'{"error":{}}')
        response.headers.add("Set-Cookie", "a=1")
        response.headers.add("Set-Cookie", "b=2")
        response.headers["Retry-After"] = "3"
        return response

    server.handler = handler
    response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
    assert response.status_code == 429
    assert [v for k, v in response.headers if k == "set-cookie"] == ["a=1", "b=2"]
    assert ("retry-after", "3") in response.headers
    assert await response.read() == b'{"error":{}}'
    await response.aclose()


async def test_a_refused_connection_is_502_unreachable() -> None:
    async with local_upstream() as gone:
        base_url = gone.base_url  # a port nobody listens on once the server is down
    upstream = Upstream(config(base_url))
    try:
        with pytest.raises(UpstreamUnreachable) as caught:
            await upstream.open("GET", "/v1/models", headers=[], content=b"")
    finally:
        await upstream.aclose()
    assert type(caught.value) is UpstreamUnreachable
    assert caught.value.status == 502
    assert caught.value.code == "upstream_unreachable"
    assert "ClientConnectorError" in caught.value.message


async def test_a_connection_dropped_before_the_headers_is_unreachable_and_not_retried(
    server: LocalUpstream, upstream: Upstream
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        if len(server.seen) == 1:
            return web.Response(body=b"first")
        assert request.transport is not None
        request.transport.abort()  # on the kept-alive connection, mid-request
        await asyncio.sleep(5)
        raise AssertionError("unreachable")

    server.handler = handler
    assert await fetch(upstream) == (200, b"first")
    # GET is idempotent: aiohttp would resend it on a kept-alive connection; not here.
    with pytest.raises(UpstreamUnreachable, match="ServerDisconnectedError"):
        await fetch(upstream)
    await asyncio.sleep(0.2)  # a resend would arrive now
    assert len(server.seen) == 2


async def test_no_free_connection_in_time_is_pool_full(server: LocalUpstream) -> None:
    holding = Script(b"data: 1\n\n", 5.0)
    server.handler = holding
    upstream = Upstream(config(server.base_url, max_connections=1, pool_s=0.1, connect_s=60))
    try:
        held = await upstream.open("GET", "/v1/models", headers=[], content=b"")
        with pytest.raises(UpstreamPoolFull) as caught:
            async with asyncio.timeout(10):  # pool_s, not connect_s, ends the wait
                await upstream.open("GET", "/v1/models", headers=[], content=b"")
        await held.aclose()
        # The slot is free again: the next request is served.
        server.handler = ok
        assert await fetch(upstream) == (200, b"ok")
    finally:
        await upstream.aclose()
    assert caught.value.status == 503
    assert caught.value.code == "upstream_pool_full"
    assert caught.value.response_headers()["retry-after"] == "1"
    assert len(server.seen) == 2


async def test_first_byte_timeout(server: LocalUpstream) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.Response()

    server.handler = handler
    upstream = Upstream(config(server.base_url, first_byte_s=0.05))
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(UpstreamTimeout) as caught:
            await upstream.open("POST", "/v1/chat/completions", headers=[], content=b"{}")
    finally:
        await upstream.aclose()
    assert loop.time() - started < 2
    assert caught.value.status == 504
    assert "0.05 s" in caught.value.message


async def test_slow_but_in_time_first_byte_is_fine(server: LocalUpstream) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.01)
        return web.Response(body=b"late")

    server.handler = handler
    upstream = Upstream(config(server.base_url, first_byte_s=2))
    try:
        assert await fetch(upstream) == (200, b"late")
    finally:
        await upstream.aclose()


async def test_a_body_the_upstream_does_not_read_is_a_write_timeout() -> None:
    released = asyncio.Event()

    async def stalls(request: web.Request) -> web.StreamResponse:
        await released.wait()  # never reads the body; answers only once the test is done
        return web.Response()

    async def big() -> AsyncIterator[bytes]:
        for _ in range(64):  # 64 MiB: far past what the sockets' buffers hold
            yield b"x" * (1 << 20)

    async with local_upstream(stalls, reads_body=False) as server:
        upstream = Upstream(config(server.base_url, write_s=0.2, first_byte_s=20))
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            with pytest.raises(UpstreamTimeout) as caught:
                await upstream.open("POST", "/v1/files", headers=[], content=big())
            elapsed = loop.time() - started
        finally:
            released.set()
            await upstream.aclose()
    assert elapsed < 2.5  # the write limit, not the 20 s first-byte one nor the handler's answer
    assert caught.value.status == 504
    assert "0.2 s to accept the request body" in caught.value.message


async def test_idle_timeout_mid_body(server: LocalUpstream) -> None:
    body = Script(b"data: 1\n\n", b"data: 2\n\n", 5.0, b"data: never\n\n")
    server.handler = body
    upstream = Upstream(config(server.base_url, idle_s=0.1))
    received: list[bytes] = []
    try:
        response = await upstream.open("POST", "/v1/chat/completions", headers=[], content=b"{}")
        with pytest.raises(UpstreamStreamBroken) as caught:
            async for chunk in response.iter_body(decoded=False):
                received.append(chunk)
        await response.aclose()
        # Closing the response closes the connection: the upstream stops generating.
        assert await eventually(lambda: body.closed)
    finally:
        await upstream.aclose()
    assert b"".join(received) == b"data: 1\n\ndata: 2\n\n"
    assert caught.value.timeout is True
    assert "0.1 s" in str(caught.value)


async def test_pauses_shorter_than_idle_limit_are_fine(server: LocalUpstream) -> None:
    server.handler = Script(b"a", 0.02, b"b", 0.02, b"c")
    upstream = Upstream(config(server.base_url, idle_s=1))
    try:
        response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
        chunks = [chunk async for chunk in response.iter_body(decoded=False)]
        await response.aclose()
    finally:
        await upstream.aclose()
    assert b"".join(chunks) == b"abc"
    assert all(chunks)  # never an empty chunk


async def test_stream_reset_mid_body_is_not_a_timeout(
    server: LocalUpstream, upstream: Upstream
) -> None:
    server.handler = Script(b"part", 0.05, RESET)
    received: list[bytes] = []
    response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
    with pytest.raises(UpstreamStreamBroken) as caught:
        async for chunk in response.iter_body(decoded=True):
            received.append(chunk)
    await response.aclose()
    assert received == [b"part"]
    assert caught.value.timeout is False
    assert "ClientPayloadError" in str(caught.value)


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda data: zlib.compress(data, wbits=-zlib.MAX_WBITS)),  # headerless
    ],
)
@pytest.mark.parametrize("decoded", [True, False])
async def test_decoded_body_undoes_content_encoding(
    server: LocalUpstream, upstream: Upstream, encoding: str, pack: Any, decoded: bool
) -> None:
    plain = b'{"object":"list","data":[]}' * 20
    packed = pack(plain)
    server.handler = Script(packed[:10], 0.01, packed[10:], headers={"Content-Encoding": encoding})
    response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
    assert ("content-encoding", encoding) in response.headers
    body = b"".join([chunk async for chunk in response.iter_body(decoded=decoded)])
    await response.aclose()
    assert body == (plain if decoded else packed)


async def test_a_body_that_does_not_decode_is_a_broken_stream(
    server: LocalUpstream, upstream: Upstream
) -> None:
    server.handler = Script(b"not gzip at all", headers={"Content-Encoding": "gzip"})
    response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
    with pytest.raises(UpstreamStreamBroken, match="error"):
        await response.read()
    await response.aclose()


async def test_connections_are_reused(server: LocalUpstream, upstream: Upstream) -> None:
    for _ in range(3):
        assert await fetch(upstream) == (200, b"ok")
    assert len({seen.peer for seen in server.seen}) == 1
    connector = upstream.client.connector
    assert connector is not None
    assert connector.limit == 512


async def test_bytes_that_arrived_before_a_reset_are_still_relayed(
    server: LocalUpstream, upstream: Upstream
) -> None:
    """aiohttp raises on a read once the connection broke, dropping what it had buffered."""
    server.handler = Script(b"data: 1\n\n", 0.05, b"data: 2\n\n", RESET)
    response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
    await asyncio.sleep(0.3)  # the last chunk and the reset are both in before we read
    received: list[bytes] = []
    with pytest.raises(UpstreamStreamBroken):
        async for chunk in response.iter_body(decoded=True):
            received.append(chunk)
    await response.aclose()
    assert b"".join(received) == b"data: 1\n\ndata: 2\n\n"


@pytest.mark.parametrize(
    ("answer", "broken"),
    [
        # A bad chunk size after a good chunk: what came first is kept. aiohttp's parser
        # error never reaches the body reader, so the idle limit is what ends it.
        ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", b"ZZ\r\n"], True),
        # A body shorter than its Content-Length, then a close.
        ([b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nhello"], True),
        # Not HTTP at all: nothing to relay, the upstream is unusable.
        ([b"SSH-2.0-OpenSSH_9.6\r\n\r\n"], False),
    ],
    ids=["bad-chunk", "short-body", "not-http"],
)
async def test_a_malformed_answer_is_a_gateway_error_not_a_crash(
    answer: list[bytes], broken: bool
) -> None:
    answered = asyncio.Event()

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            for part in answer:
                writer.write(part)
                await writer.drain()
                await asyncio.sleep(0.1)  # the head is read before the bad part arrives
        finally:
            writer.close()
            answered.set()

    raw = await asyncio.start_server(respond, "127.0.0.1", 0)
    port = raw.sockets[0].getsockname()[1]
    upstream = Upstream(config(f"http://127.0.0.1:{port}/v1", idle_s=0.5))
    try:
        if not broken:
            with pytest.raises(UpstreamUnreachable):
                await upstream.open("GET", "/v1/models", headers=[], content=b"")
            return
        response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
        received: list[bytes] = []
        with pytest.raises(UpstreamStreamBroken) as caught:
            async for chunk in response.iter_body(decoded=True):
                received.append(chunk)
        await response.aclose()
        assert b"".join(received) == b"hello"
        assert caught.value.timeout is (answer[-1] == b"ZZ\r\n")
    finally:
        await upstream.aclose()
        await asyncio.wait_for(answered.wait(), 5)
        raw.close()
        await raw.wait_closed()


async def test_a_large_body_is_written_in_pieces_with_the_loop_turning_between() -> None:
    # One write of a 3.4 MB body held the event loop ~3 ms, every other request waiting.
    from gateway.upstream.client import _Body

    body = bytes(range(256)) * (5 * 4096)  # 5 MiB
    turns = 0
    writes: list[tuple[bytes, int]] = []

    class Writer:
        buffer_size = 0

        async def write(self, chunk: bytes | memoryview) -> None:
            writes.append((bytes(chunk), turns))

    async def ticking() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(ticking())
    await asyncio.sleep(0)
    try:
        await _Body(body, write_s=5.0).write_with_length(Writer(), len(body))  # type: ignore[arg-type]
    finally:
        ticker.cancel()
    assert b"".join(chunk for chunk, _ in writes) == body
    assert len(writes) >= 5 and max(len(chunk) for chunk, _ in writes) <= 1 << 18
    seen = [turn for _, turn in writes]
    assert all(later > earlier for earlier, later in itertools.pairwise(seen))


async def test_a_large_body_arrives_whole_with_its_length(
    server: LocalUpstream, upstream: Upstream
) -> None:
    body = b'{"model":"m","pad":"' + b"x" * 900_000 + b'"}'  # (the test server takes 1 MiB)
    await fetch(upstream, "/v1/chat/completions", method="POST", content=body)
    (post,) = server.seen
    assert post.body == body
    assert post.header_values("content-length") == [str(len(body)).encode()]
    assert post.header_values("transfer-encoding") == []
