"""The upstream client's bounds, against a scripted upstream on a real local socket: the
answer's size (``max_response_bytes``, decoded size counted, a gzip bomb stopped without
being inflated) and the wait for a pooled connection (``timeouts.pool_s``)."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from functools import cache

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import UpstreamConfig, UpstreamTimeouts
from gateway.errors import UpstreamPoolFull
from gateway.upstream.body import UpstreamResponseTooLarge, UpstreamStreamBroken, WholeEvents
from gateway.upstream.client import Upstream, client_session
from tests.support.local_upstream import RESET, LocalUpstream, Script, eventually, local_upstream

LIMIT = 256 * 1024
BOMB_DECODED = 50 * 1024 * 1024


@cache
def gzip_bomb() -> bytes:
    """50 MiB of zeros, gzipped: ~50 KB on the wire."""
    return gzip.compress(bytes(BOMB_DECODED), compresslevel=9)


def config(base_url: str, *, max_response_bytes: int = LIMIT, **timeouts: float) -> UpstreamConfig:
    return UpstreamConfig(
        base_url=base_url,
        max_response_bytes=max_response_bytes,
        max_connections=1,
        timeouts=UpstreamTimeouts(**timeouts),
    )


@pytest.fixture
async def server() -> AsyncIterator[LocalUpstream]:
    async with local_upstream() as running:
        yield running


@pytest.fixture
async def upstream(server: LocalUpstream) -> AsyncIterator[Upstream]:
    client = Upstream(config(server.base_url))
    yield client
    await client.aclose()


async def body_of(upstream: Upstream, *, decoded: bool) -> list[bytes]:
    response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
    try:
        return [chunk async for chunk in response.iter_body(decoded=decoded)]
    finally:
        await response.aclose()


# --- max_response_bytes ----------------------------------------------------------------


@pytest.mark.parametrize("decoded", [True, False])
async def test_an_answer_of_exactly_the_limit_is_whole(
    server: LocalUpstream, upstream: Upstream, decoded: bool
) -> None:
    server.handler = Script(b"a" * (LIMIT // 2), 0.01, b"b" * (LIMIT // 2))
    assert b"".join(await body_of(upstream, decoded=decoded)) == b"a" * (LIMIT // 2) + b"b" * (
        LIMIT // 2
    )


@pytest.mark.parametrize("decoded", [True, False])
async def test_a_stream_past_the_limit_ends_with_too_large(
    server: LocalUpstream, upstream: Upstream, decoded: bool
) -> None:
    endless = Script(*[b"data: " + b"x" * 4090 + b"\n\n" for _ in range(10_000)])
    server.handler = endless
    received: list[bytes] = []
    response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
    with pytest.raises(UpstreamResponseTooLarge) as caught:
        async for chunk in response.iter_body(decoded=decoded):
            received.append(chunk)
    await response.aclose()
    assert sum(map(len, received)) <= LIMIT  # what went out stayed within the limit
    assert sum(map(len, received)) > LIMIT // 2  # ...and the answer did flow until then
    # A broken stream, as the chat route reports it, with a code of its own.
    assert isinstance(caught.value, UpstreamStreamBroken)
    assert caught.value.code == "upstream_response_too_large"
    assert caught.value.timeout is False
    assert str(LIMIT) in str(caught.value)
    assert await eventually(lambda: endless.closed)  # the upstream is told to stop


async def test_read_of_a_body_past_the_limit_raises_not_allocates(
    server: LocalUpstream, upstream: Upstream
) -> None:
    big = b"y" * (8 * 1024 * 1024)

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=big)

    server.handler = handler
    response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
    with pytest.raises(UpstreamResponseTooLarge):
        await response.read()
    await response.aclose()


async def test_a_gzip_bomb_stops_at_the_limit_without_being_inflated(
    server: LocalUpstream, upstream: Upstream
) -> None:
    bomb = gzip_bomb()
    assert len(bomb) < 100 * 1024
    server.handler = Script(bomb, headers={"Content-Encoding": "gzip"})
    response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
    tracemalloc.start()
    try:
        with pytest.raises(UpstreamResponseTooLarge):
            await response.read()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await response.aclose()
    # Without bounded inflation the 50 MiB would be made at once (the first chunk alone
    # holds most of the bomb); with it, about the limit is ever held.
    assert peak < 4 * LIMIT + 2 * 1024 * 1024


async def test_compressed_input_is_inflated_in_bounded_pieces(
    server: LocalUpstream,
) -> None:
    plain = bytes(range(256)) * 4096  # 1 MiB that compresses well
    server.handler = Script(gzip.compress(plain), headers={"Content-Encoding": "gzip"})
    upstream = Upstream(config(server.base_url, max_response_bytes=len(plain)))
    try:
        chunks = await body_of(upstream, decoded=True)
    finally:
        await upstream.aclose()
    assert b"".join(chunks) == plain
    assert max(map(len, chunks)) <= 64 * 1024


@pytest.mark.parametrize(
    "pack",
    [
        lambda data: zlib.compress(data),
        lambda data: zlib.compress(data, wbits=-zlib.MAX_WBITS),  # headerless "deflate"
    ],
)
async def test_deflate_past_the_limit_is_too_large(server: LocalUpstream, pack: object) -> None:
    assert callable(pack)
    server.handler = Script(pack(bytes(4 * LIMIT)), headers={"Content-Encoding": "deflate"})
    upstream = Upstream(config(server.base_url))
    try:
        with pytest.raises(UpstreamResponseTooLarge):
            await body_of(upstream, decoded=True)
    finally:
        await upstream.aclose()


async def test_a_raw_relay_counts_the_bytes_on_the_wire(
    server: LocalUpstream, upstream: Upstream
) -> None:
    # Relayed without decoding, the bomb is ~50 KB: within the limit, passed as it came
    # (the client that asked for gzip inflates it, not the gateway).
    bomb = gzip_bomb()
    server.handler = Script(bomb, headers={"Content-Encoding": "gzip"})
    assert b"".join(await body_of(upstream, decoded=False)) == bomb


# --- The wait for a pooled connection ------------------------------------------------------


async def test_a_wait_for_a_connection_that_ends_in_time_keeps_the_first_byte_deadline(
    server: LocalUpstream,
) -> None:
    """The pool's deadline applies to the wait only: once the request has its connection,
    the upstream has the whole time to first byte again (here longer than ``pool_s``)."""
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/held"):
            await release.wait()
            return web.Response(body=b"held")
        await asyncio.sleep(0.6)  # past pool_s, within first_byte_s
        return web.Response(body=b"late")

    server.handler = handler
    upstream = Upstream(config(server.base_url, pool_s=0.3, first_byte_s=5))
    try:
        held = asyncio.ensure_future(upstream.open("GET", "/v1/held", headers=[], content=b""))
        assert await eventually(lambda: len(server.seen) == 1)
        queued = asyncio.ensure_future(upstream.open("GET", "/v1/models", headers=[], content=b""))
        await asyncio.sleep(0.05)  # queued behind the held connection
        release.set()
        first = await held
        assert await first.read() == b"held"
        await first.aclose()
        second = await queued
        assert await second.read() == b"late"
        await second.aclose()
    finally:
        await upstream.aclose()


async def test_pool_full_is_told_apart_from_a_slow_upstream(server: LocalUpstream) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.Response()

    server.handler = handler
    upstream = Upstream(config(server.base_url, pool_s=0.1, first_byte_s=0.3))
    try:
        slow = asyncio.ensure_future(upstream.open("GET", "/v1/held", headers=[], content=b""))
        assert await eventually(lambda: len(server.seen) == 1)
        with pytest.raises(UpstreamPoolFull):
            await upstream.open("GET", "/v1/models", headers=[], content=b"")
        with pytest.raises(Exception) as timed_out:
            await slow
        assert getattr(timed_out.value, "code", None) == "upstream_timeout"
    finally:
        await upstream.aclose()


# --- An event stream is passed on in whole events -----------------------------------------


@given(
    events=st.lists(
        st.tuples(st.text(alphabet="ab:{} ", max_size=12), st.sampled_from(["\n", "\r\n"])),
        max_size=6,
    ),
    tail=st.text(alphabet="ab\n", max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=8),
)
def test_whole_events_cut_only_at_event_ends(
    events: list[tuple[str, str]], tail: str, cuts: list[int]
) -> None:
    stream = "".join(f"data: {text}{end}{end}" for text, end in events).encode() + tail.encode()
    points = sorted({min(cut, len(stream)) for cut in cuts} | {0, len(stream)})
    pieces = [stream[a:b] for a, b in itertools.pairwise(points)]
    whole = WholeEvents()
    out = [whole.feed(piece) for piece in pieces]
    assert b"".join(out) + whole.rest() == stream  # nothing lost, nothing reordered
    for sent in filter(None, out):
        assert sent.endswith((b"\n\n", b"\r\n\r\n", b"\r\r"))  # only whole events go out


async def test_a_break_mid_event_relays_the_whole_events_only(server: LocalUpstream) -> None:
    server.handler = Script(
        b"data: 1\n\ndata: 2",
        0.05,
        b"2 still arriving",
        RESET,
        headers={"Content-Type": "text/event-stream"},
    )
    upstream = Upstream(config(server.base_url))
    received: list[bytes] = []
    try:
        response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
        with pytest.raises(UpstreamStreamBroken):
            async for chunk in response.iter_body(decoded=True):
                received.append(chunk)
        await response.aclose()
        # Not decoded (a passthrough relay), the bytes go as they came.
        response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
        raw: list[bytes] = []
        with pytest.raises(UpstreamStreamBroken):
            async for chunk in response.iter_body(decoded=False):
                raw.append(chunk)
        await response.aclose()
    finally:
        await upstream.aclose()
    assert b"".join(received) == b"data: 1\n\n"
    assert b"".join(raw).startswith(b"data: 1\n\ndata: 2")


async def test_an_event_stream_past_the_limit_ends_with_a_whole_event(
    server: LocalUpstream,
) -> None:
    event = b'data: {"choices":[{"delta":{"content":"' + b"z" * 1000 + b'"}}]}\n\n'
    stream = event * 1000  # ~1 MB, written in pieces that do not follow the events
    pieces = [stream[i : i + 4093] for i in range(0, len(stream), 4093)]
    server.handler = Script(*pieces, headers={"Content-Type": "text/event-stream"})
    upstream = Upstream(config(server.base_url))
    received: list[bytes] = []
    try:
        response = await upstream.open("GET", "/v1/models", headers=[], content=b"")
        with pytest.raises(UpstreamResponseTooLarge):
            async for chunk in response.iter_body(decoded=True):
                received.append(chunk)
        await response.aclose()
    finally:
        await upstream.aclose()
    sent = b"".join(received)
    assert sent and len(sent) % len(event) == 0 and sent == event * (len(sent) // len(event))


async def test_the_private_wait_it_bounds_is_checked_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """aiohttp's wait for a pooled connection is a private method: if it is renamed, the
    gateway refuses to start rather than leave the wait unbounded."""
    monkeypatch.delattr(aiohttp.BaseConnector, "_wait_for_available_connection")
    with pytest.raises(RuntimeError, match="_wait_for_available_connection"):
        client_session(pool_s=1.0)
