"""The upstream client, against httpx.MockTransport (no sockets)."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from gateway.config import UpstreamConfig, UpstreamTimeouts
from gateway.errors import UpstreamTimeout, UpstreamUnreachable
from gateway.proxy.upstream import Upstream, UpstreamStreamBroken

Handler = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]


def config(base_url: str = "http://upstream.test/v1", **timeouts: float) -> UpstreamConfig:
    return UpstreamConfig(base_url=base_url, timeouts=UpstreamTimeouts(**timeouts))


class Recorder:
    """A MockTransport handler that records every request and answers from a queue."""

    def __init__(self, *responses: httpx.Response) -> None:
        self.requests: list[httpx.Request] = []
        self.responses = list(responses)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.responses:
            return self.responses.pop(0)
        return httpx.Response(200, content=b"ok")


class Parts(httpx.AsyncByteStream):
    """A response body: bytes are yielded, floats are pauses (seconds), exceptions raised."""

    def __init__(self, *parts: bytes | float | Exception) -> None:
        self.parts = parts
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            if isinstance(part, float):
                await asyncio.sleep(part)
            elif isinstance(part, Exception):
                raise part
            else:
                yield part

    async def aclose(self) -> None:
        self.closed = True


async def make(handler: Handler, cfg: UpstreamConfig | None = None) -> Upstream:
    return Upstream(cfg or config(), transport=httpx.MockTransport(handler))


async def fetch(upstream: Upstream, path: str = "/v1/models", **kwargs: Any) -> tuple[int, bytes]:
    kwargs.setdefault("headers", [])
    kwargs.setdefault("content", b"")
    response = await upstream.open(kwargs.pop("method", "GET"), path, **kwargs)
    try:
        return response.status_code, await response.read()
    finally:
        await response.aclose()


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
async def test_url_mapping(base_url: str, path: str, expected: str) -> None:
    recorder = Recorder()
    upstream = await make(recorder, config(base_url))
    try:
        assert upstream.url(path) == expected
        assert await fetch(upstream, path) == (200, b"ok")
    finally:
        await upstream.aclose()
    assert str(recorder.requests[0].url) == expected


@pytest.mark.parametrize(
    "query",
    [
        b"a=1&b=2",
        b"order=desc&after=file-%2Fabc&limit=20",
        b"q=a|b&r=[1]&s=%e2%82%ac&t=&u&c=%3D%26",
        b"k=a/b?c:d@e!$'()*,;x=%7e&y=%7E&z=c+d",
    ],
)
async def test_raw_query_is_preserved_byte_for_byte(query: bytes) -> None:
    recorder = Recorder()
    upstream = await make(recorder)
    try:
        await fetch(upstream, "/v1/files", query=query)
    finally:
        await upstream.aclose()
    assert recorder.requests[0].url.raw_path == b"/v1/files?" + query
    assert recorder.requests[0].url.query == query


async def test_no_query_sends_no_question_mark() -> None:
    recorder = Recorder()
    upstream = await make(recorder)
    try:
        await fetch(upstream, "/v1/models")
    finally:
        await upstream.aclose()
    assert recorder.requests[0].url.raw_path == b"/v1/models"


async def test_set_cookie_is_never_replayed() -> None:
    recorder = Recorder(
        httpx.Response(200, headers=[("Set-Cookie", "sid=secret; Path=/")], content=b"one"),
        httpx.Response(200, content=b"two"),
    )
    upstream = await make(recorder)
    try:
        first = await upstream.open("GET", "/v1/models", headers=[], content=b"")
        # The client still sees the upstream's Set-Cookie (it is its business) ...
        assert ("set-cookie", "sid=secret; Path=/") in first.headers
        await first.read()
        await first.aclose()
        assert await fetch(upstream, "/v1/models") == (200, b"two")
    finally:
        await upstream.aclose()
    # ... but the gateway neither keeps it nor sends it for the next client.
    assert "cookie" not in recorder.requests[1].headers
    assert len(upstream.client.cookies.jar) == 0


async def test_client_cookie_header_is_forwarded() -> None:
    recorder = Recorder()
    upstream = await make(recorder)
    try:
        await fetch(upstream, headers=[("Cookie", "mine=1")])
    finally:
        await upstream.aclose()
    assert recorder.requests[0].headers.get_list("cookie") == ["mine=1"]


async def test_redirects_are_not_followed() -> None:
    recorder = Recorder(
        httpx.Response(302, headers=[("Location", "http://upstream.test/v1/elsewhere")])
    )
    upstream = await make(recorder)
    try:
        response = await upstream.open("POST", "/v1/chat/completions", headers=[], content=b"{}")
        assert response.status_code == 302
        assert ("location", "http://upstream.test/v1/elsewhere") in response.headers
        await response.aclose()
    finally:
        await upstream.aclose()
    assert len(recorder.requests) == 1


async def test_only_the_clients_headers_are_sent() -> None:
    recorder = Recorder()
    upstream = await make(recorder)
    try:
        await fetch(upstream, headers=[("X-Custom", "1")])
        await fetch(upstream, headers=[("User-Agent", "my-app/2"), ("Accept", "text/plain")])
    finally:
        await upstream.aclose()
    bare, explicit = (request.headers for request in recorder.requests)
    for name in ("user-agent", "accept-encoding", "accept"):
        assert name not in bare, name
    assert bare["x-custom"] == "1"
    assert bare["host"] == "upstream.test"
    assert explicit.get_list("user-agent") == ["my-app/2"]
    assert explicit.get_list("accept") == ["text/plain"]
    assert "accept-encoding" not in explicit


async def test_method_body_and_repeated_headers_are_sent() -> None:
    recorder = Recorder()
    upstream = await make(recorder)

    async def body() -> AsyncIterator[bytes]:
        yield b'{"model":'
        yield b'"m"}'

    try:
        await fetch(
            upstream,
            "/v1/chat/completions",
            method="POST",
            headers=[("X-Multi", "a"), ("X-Multi", "b")],
            content=body(),
        )
        await fetch(upstream, "/v1/files/f", method="DELETE")
    finally:
        await upstream.aclose()
    post, delete = recorder.requests
    assert post.method == "POST"
    assert post.content == b'{"model":"m"}'
    assert post.headers.get_list("x-multi") == ["a", "b"]
    assert delete.method == "DELETE"


async def test_response_status_and_repeated_headers_are_returned() -> None:
    recorder = Recorder(
        httpx.Response(
            429,
            headers=[("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"), ("Retry-After", "3")],
            content=b'{"error":{}}',
        )
    )
    upstream = await make(recorder)
    try:
        response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
        assert response.status_code == 429
        assert [v for k, v in response.headers if k == "set-cookie"] == ["a=1", "b=2"]
        assert ("retry-after", "3") in response.headers
        assert await response.read() == b'{"error":{}}'
        await response.aclose()
    finally:
        await upstream.aclose()


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (httpx.ConnectError("connection refused"), UpstreamUnreachable),
        (httpx.ConnectTimeout("connect timed out"), UpstreamTimeout),
        (httpx.PoolTimeout("no free connection"), UpstreamUnreachable),
        (httpx.RemoteProtocolError("server disconnected"), UpstreamUnreachable),
        (httpx.ReadError("reset"), UpstreamUnreachable),
    ],
)
async def test_transport_errors_become_gateway_errors(
    error: httpx.HTTPError, expected: type[Exception]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    upstream = await make(handler)
    try:
        with pytest.raises(expected) as caught:
            await upstream.open("GET", "/v1/models", headers=[], content=b"")
    finally:
        await upstream.aclose()
    assert type(caught.value) is expected


async def test_connect_error_is_502_unreachable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    upstream = await make(handler)
    try:
        with pytest.raises(UpstreamUnreachable) as caught:
            await upstream.open("GET", "/v1/models", headers=[], content=b"")
    finally:
        await upstream.aclose()
    assert caught.value.status == 502
    assert caught.value.code == "upstream_unreachable"
    assert "ConnectError" in caught.value.message


async def test_first_byte_timeout() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200)

    upstream = await make(handler, config(first_byte_s=0.05))
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(UpstreamTimeout) as caught:
            await upstream.open("POST", "/v1/chat/completions", headers=[], content=b"{}")
        elapsed = loop.time() - started
    finally:
        await upstream.aclose()
    assert elapsed < 2
    assert caught.value.status == 504
    assert "0.05 s" in caught.value.message


async def test_slow_but_in_time_first_byte_is_fine() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.01)
        return httpx.Response(200, content=b"late")

    upstream = await make(handler, config(first_byte_s=2))
    try:
        assert await fetch(upstream) == (200, b"late")
    finally:
        await upstream.aclose()


async def test_idle_timeout_mid_body() -> None:
    body = Parts(b"data: 1\n\n", b"data: 2\n\n", 5.0, b"data: never\n\n")
    upstream = await make(lambda request: httpx.Response(200, stream=body), config(idle_s=0.05))
    received: list[bytes] = []
    try:
        response = await upstream.open("POST", "/v1/chat/completions", headers=[], content=b"{}")
        with pytest.raises(UpstreamStreamBroken) as caught:
            async for chunk in response.iter_body(decoded=False):
                received.append(chunk)
        await response.aclose()
    finally:
        await upstream.aclose()
    assert received == [b"data: 1\n\n", b"data: 2\n\n"]
    assert caught.value.timeout is True
    assert "0.05 s" in str(caught.value)
    assert body.closed


async def test_pauses_shorter_than_idle_limit_are_fine() -> None:
    body = Parts(b"a", 0.02, b"b", 0.02, b"c")
    upstream = await make(lambda request: httpx.Response(200, stream=body), config(idle_s=1))
    try:
        assert await fetch(upstream) == (200, b"abc")
    finally:
        await upstream.aclose()


async def test_stream_reset_mid_body_is_not_a_timeout() -> None:
    body = Parts(b"part", httpx.ReadError("connection reset"))
    upstream = await make(lambda request: httpx.Response(200, stream=body))
    received: list[bytes] = []
    try:
        response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
        with pytest.raises(UpstreamStreamBroken) as caught:
            async for chunk in response.iter_body(decoded=True):
                received.append(chunk)
        await response.aclose()
    finally:
        await upstream.aclose()
    assert received == [b"part"]
    assert caught.value.timeout is False
    assert "ReadError" in str(caught.value)


async def test_empty_chunks_are_skipped() -> None:
    body = Parts(b"", b"a", b"", b"b")
    upstream = await make(lambda request: httpx.Response(200, stream=body))
    try:
        response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
        chunks = [chunk async for chunk in response.iter_body(decoded=False)]
        await response.aclose()
    finally:
        await upstream.aclose()
    assert chunks == [b"a", b"b"]


@pytest.mark.parametrize("decoded", [True, False])
async def test_decoded_body_undoes_content_encoding(decoded: bool) -> None:
    plain = b'{"object":"list","data":[]}' * 20
    packed = gzip.compress(plain)
    upstream = await make(
        lambda request: httpx.Response(
            200, headers=[("Content-Encoding", "gzip")], stream=Parts(packed[:10], packed[10:])
        )
    )
    try:
        response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
        body = b"".join([chunk async for chunk in response.iter_body(decoded=decoded)])
        await response.aclose()
    finally:
        await upstream.aclose()
    assert body == (plain if decoded else packed)
