"""A relayed upstream stream is closed however the client's response ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from gateway.config import UpstreamConfig
from gateway.routes.relay import relay_stream, streamed
from gateway.upstream.client import Upstream, UpstreamResponse
from tests.support.local_upstream import Script, eventually, local_upstream

SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}


@asynccontextmanager
async def _opened(body: Script) -> AsyncIterator[UpstreamResponse]:
    async with local_upstream(body) as server:
        upstream = Upstream(UpstreamConfig(base_url=server.base_url))
        try:
            yield await upstream.open("POST", "/v1/chat/completions", headers=[], content=b"{}")
        finally:
            await upstream.aclose()


async def test_a_client_gone_before_the_body_started_still_closes_the_upstream() -> None:
    body = Script(b"data: 1\n\n", 30.0)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}  # gone before the first chunk was asked for

    async def send(message: dict[str, Any]) -> None:
        await asyncio.sleep(0)  # a server's send may yield (to flush the headers)

    async with _opened(body) as opened:
        await streamed(opened, relay_stream(opened), decoded=False)(SCOPE, receive, send)
        assert await eventually(lambda: body.closed)


async def test_a_client_gone_while_a_chunk_was_being_sent_still_closes_the_upstream() -> None:
    body = Script(b"data: 1\n\n", b"data: 2\n\n", 30.0)
    sending = asyncio.Event()
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message.get("body"):
            sending.set()
            await asyncio.sleep(30)  # a client that stopped reading: the write blocks

    async with _opened(body) as opened:
        response = streamed(opened, relay_stream(opened), decoded=False)
        task = asyncio.ensure_future(response(SCOPE, receive, send))
        await sending.wait()
        gone.set()
        await asyncio.wait_for(task, 5)
        assert await eventually(lambda: body.closed)
