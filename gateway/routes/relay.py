"""Shared plumbing of the proxy routes: bounded body reads, disconnect races, relaying."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.compat.starlette import stream_body
from gateway.dialects.base import StreamWatcher
from gateway.errors import PayloadTooLarge
from gateway.memory.model import Message
from gateway.observability import metrics
from gateway.service.replies import close_quietly
from gateway.upstream.body import UpstreamStreamBroken
from gateway.upstream.client import UpstreamResponse
from gateway.upstream.headers import response_headers

log = logging.getLogger(__name__)

T = TypeVar("T")

# Not a registered status: nginx's "client closed request", logged, never seen by anyone.
CLIENT_CLOSED = 499
# A stream whose turn could not be stored ends with this error instead of its
# acknowledgement ([DONE], response.completed, message_stop): the store failed, or the
# upstream's stream could not be read whole.
_NOT_STORED = (
    "the answer was not stored in memory (memory store unavailable); resend the turn to "
    "have it remembered"
)
_UNREADABLE = (
    "the answer was not stored in memory (the upstream's stream was malformed); resend "
    "the turn to have it remembered"
)


def _not_stored(watch: StreamWatcher) -> bytes:
    message = _UNREADABLE if watch.unreadable else _NOT_STORED
    return watch.error_event(message, "memory_error", "memory_not_recorded")


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


async def unless_client_leaves(receive: Receive, work: Awaitable[T]) -> T:
    """Await ``work`` (which must not need the request body), but give it up and raise
    ``ClientGone`` if the client leaves first.

    Waiting for an upstream's first byte can take a minute; a client that gave up must not
    keep an upstream generation (and its bill) running.

    Notes:
        ``work`` runs in the request's own task and one watcher task waits for the
        disconnect, then cancels the request's task: one task a request, not two (with
        ``asyncio.wait`` over both). The cancellation it caused is told from any other (a
        server shutting down) by the flag it sets and the task's cancel count.
    """
    task = asyncio.current_task()
    assert task is not None
    left = False

    async def watch() -> None:
        nonlocal left
        await _disconnected(receive)
        left = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if left and task.uncancel() == 0:
            raise ClientGone from None
        raise
    finally:
        watcher.cancel()


async def relay_stream(
    upstream: UpstreamResponse, *, decoded: bool = False
) -> AsyncGenerator[bytes, None]:
    """The upstream body as it arrives, the upstream connection closed however it ends."""
    try:
        async for chunk in upstream.iter_body(decoded=decoded):
            yield chunk
    finally:
        await close_quietly(upstream)


async def relay_watched(
    upstream: UpstreamResponse,
    watch: StreamWatcher,
    record: Callable[[Message, Any], Awaitable[bool]] | None,
    over: Callable[[StreamWatcher], None],
) -> AsyncGenerator[bytes, None]:
    """Pass the stream through chunk by chunk while ``watch`` watches it for a clean end.

    The answer is recorded (``record``, None: not to be; False when it was not) on the
    acknowledging event (chat's ``[DONE]``, Responses' ``response.completed``) before
    that event is passed on (or, for chat, when the upstream closes after a
    ``finish_reason``: ``[DONE]`` is then the gateway's); see the dialect's watch for
    what counts. The acknowledging event reaches the client only for a stored turn: a
    turn that is not (the store failed, the stream was malformed) ends with an error
    event instead. Its usage goes with it:
    chat's usage chunk comes before ``[DONE]``, Responses' usage is in the completed
    event. ``over`` is told when the stream is over, however it ended (a client that
    left included).
    """

    async def recorded(watch: StreamWatcher) -> bool:
        """False when the answer should have been recorded and was not."""
        if record is None:
            return True
        if watch.recordable:
            return await record(watch.message(), watch.usage)
        if watch.unreadable:
            # Relayed untouched, as it came; not stored, so not acknowledged either (the
            # client gets an error event in place of [DONE] / response.completed).
            log.warning("turn not recorded: the upstream stream was malformed")
            return False
        return True

    done_recording = False
    try:
        held = b""  # an event begun but not ended, when the dialect holds those back
        async for chunk in upstream.iter_body(decoded=True):
            watch.feed(chunk)
            if held:
                chunk, held = held + chunk, b""
            if watch.done and not done_recording:
                done_recording = True
                # The answer's events go out at once; only [DONE] waits for the record
                # (an upstream often sends the last events and [DONE] in one chunk, and a
                # fast one sends the whole answer so).
                before, done = watch.split(chunk)
                if before:
                    yield before
                if not await recorded(watch):
                    # And no acknowledgement: the turn is not stored.
                    yield _not_stored(watch)
                    return
                chunk = done
            else:
                chunk, held = watch.hold(chunk)
            if chunk:
                yield chunk
        watch.close()
        # ``held`` is an event the upstream never ended: a client discards it (SSE), so
        # it is dropped, and an error event after it is read whole.
        last = await _closing_event(watch, done_recording, recorded, record is not None)
        if last:
            yield last
    except UpstreamStreamBroken as error:
        # Headers are gone: report in-band, and no [DONE] so the client knows.
        log.warning("upstream stream ended abnormally: %s", error)
        metrics.stream_error(error.code)
        yield watch.error_event(str(error), "upstream_error", error.code)
    finally:
        over(watch)
        await close_quietly(upstream)


async def _closing_event(
    watch: StreamWatcher,
    done_recording: bool,
    recorded: Callable[[StreamWatcher], Awaitable[bool]],
    stores: bool,
) -> bytes:
    """What follows a stream the upstream closed cleanly (b"": nothing)."""
    if not watch.ended:
        # A clean close in mid-answer is a break all the same; without this event the
        # client would take the truncated answer for the whole one.
        log.warning("upstream closed the stream before the answer ended")
        metrics.stream_error("upstream_stream_incomplete")
        return watch.error_event(
            "the upstream closed the stream before the answer ended",
            "upstream_error",
            "upstream_stream_incomplete",
        )
    if done_recording:
        return b""
    # Ended without its acknowledging event (a finish_reason, then the close): the
    # gateway acknowledges a stored turn itself, and says so when it is not stored.
    if not await recorded(watch):
        return _not_stored(watch)
    return watch.acknowledgement() if stores and watch.recordable else b""


def raw_headers(
    upstream: UpstreamResponse, *, decoded: bool, extra: dict[str, str] | None = None
) -> list[tuple[bytes, bytes]]:
    """The upstream's end-to-end headers plus the gateway's own, as ASGI wants them."""
    headers = response_headers(upstream.headers, decoded=decoded) + list((extra or {}).items())
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]


class _UpstreamStreamingResponse(StreamingResponse):
    """Streams an upstream body; however the response ends, the upstream is closed.

    When the client disconnects, the body's streaming is cancelled: possibly before the
    body generator has started (its ``finally`` then never runs), or while the generator
    waits at a ``yield`` (it would be closed only when garbage-collected). Either way the
    upstream would go on generating for nobody; this closes it at once.
    """

    def __init__(self, upstream: UpstreamResponse, body: AsyncGenerator[bytes, None]) -> None:
        super().__init__(body, status_code=upstream.status_code)
        self._upstream = upstream
        self._body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Starlette watches for the disconnect in an anyio task group (uvicorn declares
        # ASGI 2.3); one plain watcher task does the same for less.
        try:
            await unless_client_leaves(receive, stream_body(self, send))
        except ClientGone:
            pass
        finally:
            with anyio.CancelScope(shield=True):
                await self._body.aclose()
                await self._upstream.aclose()


def streamed(
    upstream: UpstreamResponse,
    body: AsyncGenerator[bytes, None],
    *,
    decoded: bool,
    extra: dict[str, str] | None = None,
) -> Response:
    response = _UpstreamStreamingResponse(upstream, body)
    response.raw_headers = raw_headers(upstream, decoded=decoded, extra=extra)
    return response
