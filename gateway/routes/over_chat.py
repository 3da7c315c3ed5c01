"""Which upstream API serves a Responses request (``upstream.responses``), and the chat
answer read as a Responses one.

``native`` forwards to the upstream's ``/v1/responses``. ``chat`` sends every Responses
request to ``/chat/completions`` (``dialects/responses/over_chat``) and hands the route
a reply whose body is the Responses API's: the route, its dialect and its relay treat it
as any upstream's answer, so recording, ``response.completed`` only once stored, and
usage work unchanged. ``auto`` (the default) tries ``/v1/responses`` and, on a 404 or
405 that is not about the request itself, remembers for the process that this upstream
serves chat only, logs it once, and serves over chat from then on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

from gateway import codec
from gateway.dialects.responses.over_chat import (
    EventsFromChat,
    chat_body,
    response_from_completion,
)
from gateway.observability import request_log
from gateway.service.replies import parsed, read_whole
from gateway.upstream.client import Upstream, UpstreamResponse

log = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"
# What a server without the endpoint answers; a 404 in OpenAI's envelope about the
# request (a model, an item it does not have) is the upstream's answer, not this.
_NO_ENDPOINT = (404, 405)


class _Replayed(UpstreamResponse):
    """A reply whose body was read already (to judge it), relayed as it was read.

    (An ``UpstreamResponse`` by type, for the route and relay that take one; it holds no
    connection: the one it was read from is closed.)"""

    def __init__(self, status_code: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status_code = status_code
        self.headers = _decoded(headers)
        self._body = body

    async def iter_body(self, *, decoded: bool) -> AsyncIterator[bytes]:
        yield self._body

    async def aclose(self) -> None:
        pass


class ChatBackedReply(UpstreamResponse):
    """A chat-completions reply read as the Responses API's (decoded, converted as it
    arrives): a 200's body converted, an error's passed as it came (both APIs' errors are
    OpenAI's envelope)."""

    def __init__(self, reply: UpstreamResponse, request: dict[str, Any], stream: bool) -> None:
        self._reply = reply
        self._request = request
        self._stream = stream
        self.status_code = reply.status_code
        self.headers = _decoded(reply.headers)

    async def iter_body(self, *, decoded: bool) -> AsyncIterator[bytes]:
        if self.status_code != 200:
            async for chunk in self._reply.iter_body(decoded=True):
                yield chunk
            return
        created = int(time.time())
        if not self._stream:
            raw = b"".join([chunk async for chunk in self._reply.iter_body(decoded=True)])
            completion = await parsed(raw)
            response = response_from_completion(completion, self._request, created_at=created)
            yield codec.dumps(response)
            return
        events = EventsFromChat(self._request, created_at=created)
        async for chunk in self._reply.iter_body(decoded=True):
            converted = events.feed(chunk)
            if converted:
                yield converted
        last = events.close()
        if last:
            yield last

    async def aclose(self) -> None:
        await self._reply.aclose()


def _decoded(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The headers of a body the gateway rewrote: its length and encoding are not the
    upstream's (a passthrough relays the headers it is given)."""
    return [(k, v) for k, v in headers if k not in ("content-length", "content-encoding")]


def _is_no_endpoint(status: int, body: bytes) -> bool:
    """A 404/405 saying the server has no such path, not OpenAI's 404 about the request
    (``model_not_found``, an item it does not hold: an ``invalid_request_error``)."""
    if status == 405:
        return True
    try:
        data = codec.loads(body)
    except ValueError:
        return True  # Ollama's "404 page not found"
    error = data.get("error") if isinstance(data, dict) else None
    return not (isinstance(error, dict) and error.get("type") == "invalid_request_error")


class ResponsesUpstream:
    """Opens a Responses request on the upstream API ``mode`` says; ``auto`` learns it."""

    def __init__(self, upstream: Upstream, mode: str) -> None:
        self.upstream = upstream
        self.mode = mode
        self.chat_only = mode == "chat"

    async def open(
        self,
        native: Callable[[], bytes],
        conversation: Callable[[], Awaitable[tuple[dict[str, Any], Sequence[dict[str, Any]]]]],
        *,
        query: bytes,
        headers: list[tuple[str, str]],
    ) -> UpstreamResponse:
        """The answer to a Responses request: ``native()`` is its body for the upstream's
        own ``/v1/responses``; ``conversation()`` its body and its conversation as chat
        messages (made only when it goes over chat)."""
        if not self.chat_only:
            reply = await self.upstream.open(
                "POST", "/v1/responses", query=query, headers=headers, content=native()
            )
            if self.mode == "native" or reply.status_code not in _NO_ENDPOINT:
                return reply
            status, raw = reply.status_code, await read_whole(reply)
            if not _is_no_endpoint(status, raw):
                return _Replayed(status, reply.headers, raw)
            if not self.chat_only:
                self.chat_only = True
                log.info(
                    "the upstream answered %d on /v1/responses: serving the Responses API "
                    "over its chat completions from now on (upstream.responses: auto)",
                    status,
                )
        body, context = await conversation()
        request_log.note(responses_over="chat")
        chat = codec.dumps(chat_body(body, context))
        # The body is the gateway's: the client's encoding of its own does not describe it.
        sent = [(k, v) for k, v in headers if k.lower() != "content-encoding"]
        reply = await self.upstream.open("POST", CHAT_PATH, query=query, headers=sent, content=chat)
        return ChatBackedReply(reply, body, bool(body.get("stream")))
