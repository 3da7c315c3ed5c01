"""The request middleware: each request's id, its metrics and its access line (pure ASGI)."""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.compat.starlette import matched_path
from gateway.observability import metrics, request_log


class MetricsMiddleware:
    """Per request: its id, its metrics, and its access line; one pure-ASGI layer for all.

    The request id (the client's valid ``X-Request-Id``, else a new one) is set for the
    request's tasks (``request_log``) and returned on every response as
    ``X-Gateway-Request-Id``. When the response is complete (a stream: after its last
    byte) the request is counted and timed (``metrics``) and its line is logged on
    ``gateway.access`` (``access_log``).
    """

    def __init__(self, app: ASGIApp, *, metrics: bool = True, access_log: bool = True) -> None:
        self.app = app
        self.metrics = metrics
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_timer = metrics.start_timer(scope)
        access_log = self.access_log
        entry, token = request_log.begin(scope["headers"], logged=access_log)
        status = 0
        headers_sent = 0.0
        response: dict[str, str] = {}

        async def watched_send(message: Message) -> None:
            nonlocal status, headers_sent
            if message["type"] == "http.response.start":
                status = message["status"]
                headers_sent = time.perf_counter()
                message["headers"] = _with_request_id(
                    message.get("headers") or (), entry, response if access_log else None
                )
            await send(message)

        if self.metrics:
            metrics.IN_FLIGHT.inc()
        try:
            await self.app(scope, receive, watched_send)
        except BaseException:
            status = status or 500
            raise
        finally:
            try:
                if self.metrics:
                    metrics.IN_FLIGHT.dec()
                    metrics.request_done(
                        _route(scope), scope["method"], status or 499, request_timer, headers_sent
                    )
                if access_log and request_log.ACCESS.isEnabledFor(logging.INFO):
                    if entry.pending:  # a count off the loop the line needs (wait_for)
                        await request_log.settle(entry)
                    _log_access(scope, entry, request_timer, status or 499, headers_sent, response)
            finally:
                request_log.end(token)


def _route(scope: Scope) -> str:
    return matched_path(scope) or "unmatched"


# Response headers the access line reports: the upstream's id for the request (OpenAI's
# ``x-request-id``, relayed unchanged) and the memory status the client was told.
_LOGGED_HEADERS = {b"x-request-id": "upstream_request_id", b"x-memory-status": "memory_status"}


def _with_request_id(
    headers: Any, entry: request_log.RequestLog, logged: dict[str, str] | None
) -> list[tuple[bytes, bytes]]:
    """The response's headers with the request id added (one relayed from an upstream
    gateway would name another request: dropped); the logged ones read on the way."""
    out = []
    for name, value in headers:
        if name == request_log.RESPONSE_HEADER:
            continue
        if logged is not None:
            field = _LOGGED_HEADERS.get(name)
            if field is not None:
                logged[field] = value[:128].decode("latin-1")
        out.append((name, value))
    out.append((request_log.RESPONSE_HEADER, entry.header))
    return out


def _log_access(
    scope: Scope,
    entry: request_log.RequestLog,
    request_timer: metrics.RequestTimer,
    status: int,
    headers_sent: float,
    response: dict[str, str],
) -> None:
    """The access line, with the timings the metrics observe (in milliseconds)."""
    ended = time.perf_counter()
    line: dict[str, Any] = {
        "request_id": entry.request_id,
        "method": scope["method"],
        "route": _route(scope),
        "status": status,
        "duration_ms": round((ended - request_timer.received) * 1000, 3),
    }
    started, ready = request_timer.upstream_started, request_timer.upstream_ready
    if started:
        if ready and headers_sent:
            added = headers_sent - request_timer.received - (ready - started)
            line["added_ms"] = round(max(added, 0.0) * 1000, 3)
        line["upstream_ms"] = round((ended - started) * 1000, 3)
    request_log.access_line(entry, line, response)
