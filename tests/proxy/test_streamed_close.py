"""A relayed upstream stream is closed however the client's response ends."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from gateway.config import UpstreamConfig
from gateway.proxy.upstream import Upstream
from gateway.routes.relay import relay_stream, streamed
from tests.proxy.test_upstream import Parts

SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}


async def _opened(body: Parts) -> Any:
    upstream = Upstream(
        UpstreamConfig(base_url="http://upstream.test/v1"),
        transport=httpx.MockTransport(lambda request: httpx.Response(200, stream=body)),
    )
    response = await upstream.open("POST", "/v1/chat/completions", headers=[], content=b"{}")
    return upstream, response


async def test_a_client_gone_before_the_body_started_still_closes_the_upstream() -> None:
    body = Parts(b"data: 1\n\n", 30.0)
    upstream, opened = await _opened(body)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}  # gone before the first chunk was asked for

    async def send(message: dict[str, Any]) -> None:
        await asyncio.sleep(0)  # a server's send may yield (to flush the headers)

    await streamed(opened, relay_stream(opened), decoded=False)(SCOPE, receive, send)
    assert body.closed
    await upstream.aclose()


async def test_a_client_gone_while_a_chunk_was_being_sent_still_closes_the_upstream() -> None:
    body = Parts(b"data: 1\n\n", b"data: 2\n\n", 30.0)
    upstream, opened = await _opened(body)
    sending = asyncio.Event()
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message.get("body"):
            sending.set()
            await asyncio.sleep(30)  # a client that stopped reading: the write blocks

    response = streamed(opened, relay_stream(opened), decoded=False)
    task = asyncio.ensure_future(response(SCOPE, receive, send))
    await sending.wait()
    gone.set()
    await asyncio.wait_for(task, 5)
    assert body.closed
    await upstream.aclose()
