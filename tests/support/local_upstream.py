"""A scripted upstream on a real local socket, for the upstream client's tests.

Each test gives the handler (an aiohttp.web handler); every request is recorded with its
raw request target, raw header bytes and body, as they crossed the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RESET = object()  # in a Script: the upstream drops the connection there


@dataclass
class Seen:
    method: str
    target: str  # the raw request target: path and query as sent
    raw_headers: list[tuple[bytes, bytes]]
    body: bytes
    peer: object  # the client's (address, port): the same for a reused connection

    def header_values(self, name: str) -> list[bytes]:
        return [v for k, v in self.raw_headers if k.lower() == name.lower().encode()]


async def ok(request: web.Request) -> web.StreamResponse:
    return web.Response(body=b"ok")


@dataclass
class LocalUpstream:
    handler: Handler = ok
    reads_body: bool = True  # False: the body is left unread (an upstream that stalls)
    seen: list[Seen] = field(default_factory=list)
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read() if self.reads_body else b""
        peer = request.transport.get_extra_info("peername") if request.transport else None
        headers = list(request.raw_headers)
        self.seen.append(Seen(request.method, request.raw_path, headers, body, peer))
        return await self.handler(request)


@contextlib.asynccontextmanager
async def local_upstream(
    handler: Handler = ok, *, reads_body: bool = True
) -> AsyncIterator[LocalUpstream]:
    server = LocalUpstream(handler, reads_body=reads_body)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server._dispatch)
    # Cancelled when the client goes: a Script notices that its connection was closed.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.port = runner.addresses[0][1]
    try:
        yield server
    finally:
        await runner.cleanup()


class Script:
    """A streamed answer: bytes are written, floats are pauses (seconds), RESET drops.

    ``closed`` tells whether the client closed the connection before the script ended.
    """

    def __init__(self, *parts: bytes | float | object, headers: dict[str, str] | None = None):
        self.parts = parts
        self.headers = headers or {}
        self.closed = False

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers=self.headers)
        await response.prepare(request)
        try:
            for part in self.parts:
                if isinstance(part, float):
                    await asyncio.sleep(part)
                elif part is RESET:
                    assert request.transport is not None
                    request.transport.abort()
                    return response
                else:
                    assert isinstance(part, bytes)
                    await response.write(part)
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            self.closed = True
            raise
        return response


async def eventually(check: Callable[[], bool], within_s: float = 5.0) -> bool:
    """Whether ``check`` becomes true within ``within_s`` (the other side acts on its own time)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True
