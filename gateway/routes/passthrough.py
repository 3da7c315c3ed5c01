"""Every ``/v1/*`` path the gateway does not remember for: forwarded untouched."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway import metrics
from gateway.proxy.headers import request_headers
from gateway.proxy.upstream import Upstream
from gateway.routes.relay import (
    CLIENT_CLOSED,
    ClientGone,
    relay_stream,
    streamed,
    unless_client_leaves,
)


class Passthrough:
    """Method, path, query, body, status and (end-to-end) headers pass as they are."""

    def __init__(self, upstream: Upstream, api_key: str | None) -> None:
        self.upstream = upstream
        self.api_key = api_key

    async def forward(
        self, request: Request, *, body: bytes | None = None, extra: dict[str, str] | None = None
    ) -> Response:
        headers = request_headers(
            request.headers.items(),
            api_key=self.api_key,
            strip_gateway_headers=False,
            identity_encoding=False,
        )
        opening = self.upstream.open(
            request.method,
            request.scope["path"],  # not request.url: building it is ~2% of a request
            query=request.scope.get("query_string", b""),
            headers=headers,
            content=request.stream() if body is None else body,
        )
        timer = metrics.timer(request.scope)
        timer.upstream_sent()
        if body is None:
            # The request body is still streaming in: we cannot also watch for a disconnect.
            upstream = await opening
        else:
            try:
                upstream = await unless_client_leaves(request.receive, opening)
            except ClientGone:
                return Response(status_code=CLIENT_CLOSED)
        timer.upstream_answered()
        return streamed(upstream, relay_stream(upstream), decoded=False, extra=extra)
