"""Shared plumbing of the proxy routes: bounded body reads, disconnect races, relaying."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive

from gateway.errors import PayloadTooLarge
from gateway.proxy.headers import response_headers
from gateway.proxy.upstream import UpstreamResponse

T = TypeVar("T")

# Not a registered status: nginx's "client closed request", logged, never seen by anyone.
CLIENT_CLOSED = 499


class ClientGone(Exception):
    """The client disconnected before the upstream answered."""


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing more than ``limit`` bytes without reading them all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is larger than the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is larger than the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """Run ``work`` (which must not need the request body) but cancel it if the client leaves.

    Waiting for an upstream's first byte can take a minute; a client that gave up must not
    keep an upstream generation (and its bill) running.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientGone
    return task.result()


async def relay_stream(upstream: UpstreamResponse) -> AsyncIterator[bytes]:
    """The upstream body as it arrives, the upstream connection closed however it ends."""
    try:
        async for chunk in upstream.iter_body(decoded=False):
            yield chunk
    finally:
        await upstream.aclose()


def raw_headers(
    upstream: UpstreamResponse, *, decoded: bool, extra: dict[str, str] | None = None
) -> list[tuple[bytes, bytes]]:
    """The upstream's end-to-end headers plus the gateway's own, as ASGI wants them."""
    headers = response_headers(upstream.headers, decoded=decoded) + list((extra or {}).items())
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]


def streamed(
    upstream: UpstreamResponse,
    body: AsyncIterator[bytes],
    *,
    decoded: bool,
    extra: dict[str, str] | None = None,
) -> Response:
    response = StreamingResponse(body, status_code=upstream.status_code)
    response.raw_headers = raw_headers(upstream, decoded=decoded, extra=extra)
    return response
