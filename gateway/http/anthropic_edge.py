"""Anthropic's Messages API at the gateway's edge: its key header and its error envelope.

Anthropic's clients send their key as ``x-api-key`` (Claude Code's ``ANTHROPIC_API_KEY``)
or as ``Authorization: Bearer`` (the ``anthropic`` SDK's, Claude Code's
``ANTHROPIC_AUTH_TOKEN``). On ``/v1/messages`` paths a request with ``x-api-key`` and no
Authorization is given ``Authorization: Bearer <key>`` too, before anything reads it:
authentication, rate limits and tenancy then treat the key as they treat an OpenAI
client's (the upstream gets it in the header it came in: ``upstream.headers``). Two keys,
one in each header, are refused (400): the gateway would check one while the upstream
might use the other.

An error of the gateway's own on those paths (a refusal by any layer: its body is
OpenAI's envelope, ``{"error": {...}}`` with no top-level ``type``) is rewritten to
Anthropic's (``errors.anthropic_body``), which the ``anthropic`` SDK reads; an
upstream's answer, already in that envelope, passes untouched.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import codec
from gateway.errors import anthropic_body

PREFIX = "/v1/messages"
# A gateway error body is small; anything past this is not one and is passed on as is.
_MOST_ERROR_BYTES = 64 * 1024


def speaks_anthropic(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def _with_bearer(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]] | None:
    """The headers with ``x-api-key``'s key as Authorization too; None: two keys."""
    keys = [value for name, value in headers if name.lower() == b"x-api-key"]
    if not keys:
        return headers
    if len(keys) > 1 or any(name.lower() == b"authorization" for name, _ in headers):
        return None
    return [*headers, (b"authorization", b"Bearer " + keys[0].strip())]


def _rewritten(body: bytes, status: int) -> bytes | None:
    """Anthropic's envelope for a gateway error's body; None: not one."""
    try:
        data = codec.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or "type" in data or not isinstance(data.get("error"), dict):
        return None
    message = data["error"].get("message")
    return codec.dumps(anthropic_body(status, message if isinstance(message, str) else ""))


async def _refuse_two_keys(send: Send) -> None:
    body = codec.dumps(
        anthropic_body(400, "send one key: in x-api-key or in Authorization, not both")
    )
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class AnthropicEdge:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not speaks_anthropic(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = _with_bearer(list(scope["headers"]))
        if headers is None:
            await _refuse_two_keys(send)
            return
        # The request's own scope, its headers replaced (not a copy): the route the router
        # records in it names the request in the metrics and the access log outside.
        scope["headers"] = headers
        await self.app(scope, receive, _Envelope(send))


class _Envelope:
    """A ``send`` that holds a JSON error's start and body, to rewrite them at the end."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.start: Message | None = None
        self.body: list[bytes] = []
        self.size = 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and _json_error(message):
            self.start = message
            return
        if self.start is None or message["type"] != "http.response.body":
            await self.send(message)
            return
        self.body.append(message.get("body", b""))
        self.size += len(self.body[-1])
        if self.size > _MOST_ERROR_BYTES:
            await self._flush(b"".join(self.body), message.get("more_body", False))
        elif not message.get("more_body", False):
            raw = b"".join(self.body)
            await self._flush(_rewritten(raw, self.start["status"]) or raw, False)

    async def _flush(self, body: bytes, more: bool) -> None:
        start, self.start, self.body = self.start, None, []
        assert start is not None
        headers: list[Any] = [
            (name, value) for name, value in start["headers"] if name.lower() != b"content-length"
        ]
        if not more:
            headers.append((b"content-length", b"%d" % len(body)))
        await self.send({**start, "headers": headers})
        await self.send({"type": "http.response.body", "body": body, "more_body": more})


def _json_error(start: Message) -> bool:
    if int(start["status"]) < 400:
        return False
    for name, value in start["headers"]:
        if name.lower() == b"content-type":
            return bytes(value).split(b";", 1)[0].strip().lower() == b"application/json"
    return False
