"""Every ``/v1/*`` path the gateway does not remember for: forwarded untouched, within
the upstream's prefix and its allowlist (``upstream.passthrough``).

Notes:
    The upstream URL is the configured base URL plus the path after ``/v1``, so a path
    that could climb out of it must never be sent: a dot segment (".", "..", raw or
    percent-encoded), an encoded slash or backslash (which a server may decode into a
    separator), and an encoded "?" or "#" (which would turn part of the path into a
    query or fragment) are refused with 400 before anything goes upstream. The checks
    read the raw path as the client sent it and the decoded one. Only the allowlisted
    paths of the OpenAI API (by default) are forwarded at all, with only the allowlisted
    request headers (``upstream/headers.py``, ``upstream.forward_headers``): the gateway's
    own (``X-Session-Id``...), the client's cookies and other credentials never leave it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence

from starlette.requests import Request
from starlette.responses import Response

from gateway.auth.authenticator import Authenticator, Caller
from gateway.errors import InvalidRequest, NotAllowed
from gateway.http import rate_limits, token_costs
from gateway.observability import metrics
from gateway.routes.relay import (
    CLIENT_CLOSED,
    ClientGone,
    relay_stream,
    streamed,
    unless_client_leaves,
)
from gateway.upstream.client import Upstream, UpstreamResponse
from gateway.upstream.headers import BUILT_IN, Allowlist, request_headers

# Percent-encodings that could change how the path is read upstream: ".", "/", "\", "?",
# "#", and "%" itself (a double encoding, decoded once more by a second server).
_ENCODED = re.compile(rb"%(2e|2f|5c|3f|23|25)", re.IGNORECASE)


def _pattern(glob: str) -> re.Pattern[str]:
    """An allowlist entry as a pattern: "*" one segment, "**" any (at least one)."""
    parts = []
    for piece in re.split(r"(\*\*|\*)", glob):
        if piece == "**":
            parts.append(r"[^?#]+")
        elif piece == "*":
            parts.append(r"[^/?#]+")
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts))


def check_path(raw_path: bytes, path: str) -> None:
    """Refuse a path that could leave the upstream's prefix (400)."""
    if _ENCODED.search(raw_path) or "\\" in path:
        raise InvalidRequest(
            "the path must not hold encoded dots, slashes, '?', '#', '%' or backslashes",
            code="invalid_path",
        )
    # Both as sent and as decoded: a server may already have removed dot segments.
    dots = any(segment in (b".", b"..") for segment in raw_path.split(b"/"))
    if dots or any(segment in (".", "..") for segment in path.split("/")):
        raise InvalidRequest("the path must not hold '.' or '..' segments", code="invalid_path")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        raise InvalidRequest("the path must not hold control characters", code="invalid_path")


class Passthrough:
    """Method, path, query, body and status pass as they are; the allowlisted request headers
    and the (end-to-end) response headers too."""

    def __init__(
        self,
        upstream: Upstream,
        auth: Authenticator,
        allowed: Sequence[str],
        allowlist: Allowlist = BUILT_IN,
    ) -> None:
        self.upstream = upstream
        self.auth = auth
        self._allowed = [_pattern(glob) for glob in allowed]
        # The client's request headers that go upstream (the memory route's too).
        self.allowlist = allowlist

    async def handle(self, request: Request) -> Response:
        """``/v1/*`` other than chat completions: the caller authenticated, then forwarded."""
        return await self.forward(request, self.auth.identify(request.headers))

    def allows(self, path: str) -> bool:
        """Whether a ``/v1/…`` path is on the allowlist."""
        relative = path[len("/v1/") :] if path.startswith("/v1/") else ""
        return any(pattern.fullmatch(relative) for pattern in self._allowed)

    async def forward(
        self,
        request: Request,
        caller: Caller,
        *,
        body: bytes | None = None,
        extra: dict[str, str] | None = None,
        tokens: int | None = None,
        opener: Callable[[list[tuple[str, str]]], Awaitable[UpstreamResponse]] | None = None,
    ) -> Response:
        """``tokens``: the prompt's, when the caller counted them (else, under a token
        limit, the body's length tells: ``token_costs.length_tokens``). ``opener``: sends
        ``body`` with the headers it is given, in place of the upstream at this path (the
        Responses API served over chat completions: ``routes/over_chat``)."""
        path = request.scope["path"]  # not request.url: building it is ~2% of a request
        check_path(request.scope.get("raw_path") or path.encode(), path)
        chat = path == "/v1/chat/completions" and request.method == "POST"
        if not chat and not self.allows(path):
            raise NotAllowed(
                f"{request.method} {path} is not passed to the upstream (upstream.passthrough)",
                # Chat completions take POST (the memory route); another path, none here.
                allow=("POST",) if path == "/v1/chat/completions" else (),
                code="path_not_allowed",
            )
        metered = rate_limits.counting_tokens()
        if metered:
            # Reserved before anything goes upstream (429 when they would pass the limit).
            if tokens is None:
                tokens = token_costs.length_tokens(path, request.headers, body)
            await rate_limits.reserve(tokens)
        headers = request_headers(
            request.headers.items(),
            api_key=self.upstream.key_for(caller.upstream_key),
            rewritten=False,
            allowlist=self.allowlist,
            key_header=self.upstream.key_header,
        )
        if metered:
            headers = _uncompressed(headers)
        if body is None and not _has_body(request):
            # No body at all (a GET): none upstream either, not an empty chunked one (an
            # upstream that reads none on a GET kept its terminator in the connection,
            # and the next request on it failed).
            body = b""
        opening = (
            opener(headers)
            if opener is not None
            else self.upstream.open(
                request.method,
                path,
                query=request.scope.get("query_string", b""),
                headers=headers,
                content=request.stream() if body is None else body,
            )
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
        if upstream.status_code == 401:
            self.auth.refused(request.headers)  # the memory API refuses the key too, now
        elif 200 <= upstream.status_code < 300:
            self.auth.accepted(request.headers)
        # Its usage settles the reservation (``rate_limits.metered``: read from its end).
        body_out = rate_limits.metered(relay_stream(upstream))
        return streamed(upstream, body_out, decoded=False, extra=extra)


def _uncompressed(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` asking for an uncompressed answer: one whose usage can be read as it
    is relayed (under a token limit only)."""
    kept = [(name, value) for name, value in headers if name.lower() != "accept-encoding"]
    return [*kept, ("accept-encoding", "identity")]


def _has_body(request: Request) -> bool:
    """Whether the client's request has a body (RFC 9112 §6: its length is declared)."""
    length = request.headers.get("content-length")
    return "transfer-encoding" in request.headers or (length is not None and length != "0")
