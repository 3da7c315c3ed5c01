"""Gateway errors and their OpenAI-style envelope.

    GatewayError                       status  type
    ├── InvalidRequest                 400     invalid_request_error
    │   ├── Unauthorized               401     invalid_request_error
    │   ├── Forbidden                  403     invalid_request_error
    │   ├── NotAllowed                 405     invalid_request_error
    │   └── PayloadTooLarge            413     invalid_request_error
    ├── NotFound                       404     not_found
    ├── QuotaExceeded                  429     insufficient_quota
    ├── TooManyRequests                429     requests | tokens  (rate limits; Retry-After)
    ├── MemoryUnavailable              503     memory_unavailable  (fail-closed Redis)
    └── UpstreamError
        ├── UpstreamUnreachable        502     upstream_error
        ├── UpstreamPoolFull           503     upstream_error  (no connection free; Retry-After)
        └── UpstreamTimeout            504     upstream_timeout

Upstream 4xx/5xx answers are not errors of the gateway: they are passed through as they
came. Every error reaches the client as ``{"error": {"message", "type", "param", "code"}}``,
but on Anthropic's Messages API (``anthropic_body``), whose clients read its own envelope.

Two failures never reach a client and are not in that tree: a background model that could
not answer (``SummarizerUnavailable``, ``EmbeddingsUnavailable``). The model adapters in
``upstream/`` raise them and ``memory/`` falls back on them, so they live here, below both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar


class GatewayError(Exception):
    """An error the gateway reports to the client itself."""

    status = 500
    type = "server_error"
    code: str | None = None
    headers: ClassVar[dict[str, str]] = {}  # sent with the error

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, param=self.param, code=self.code)

    def response_headers(self) -> dict[str, str]:
        """The headers sent with the error (an error may name its own: ``NotAllowed``)."""
        return self.headers


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(InvalidRequest):
    status = 401
    code = "invalid_api_key"
    headers: ClassVar[dict[str, str]] = {"www-authenticate": "Bearer"}


class Forbidden(InvalidRequest):
    status = 403
    code = "forbidden"


class NotAllowed(InvalidRequest):
    """A path the gateway does not pass upstream (outside the passthrough's allowlist),
    or a method its path does not take.

    ``allow``: the methods the path does take, sent as ``Allow`` (RFC 9110 requires it
    on a 405; empty says no method is allowed, as for a path not passed upstream at all).
    """

    status = 405
    code = "not_allowed"

    def __init__(
        self,
        message: str,
        *,
        allow: Sequence[str] = (),
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.allow = tuple(allow)

    def response_headers(self) -> dict[str, str]:
        return {"allow": ", ".join(self.allow)}


class NotFound(GatewayError):
    status = 404
    type = "not_found"
    code = "not_found"


class QuotaExceeded(GatewayError):
    status = 429
    type = "insufficient_quota"
    code = "insufficient_quota"


class TooManyRequests(GatewayError):
    """A rate limit reached (``limits``). As OpenAI answers: type "requests" or "tokens",
    code "rate_limit_exceeded", ``Retry-After`` in whole seconds (the SDKs wait that long
    before their retry) and the limit's ``x-ratelimit-*`` headers."""

    status = 429
    code = "rate_limit_exceeded"

    def __init__(
        self, message: str, *, kind: str, retry_after_s: int, limit_headers: dict[str, str]
    ) -> None:
        super().__init__(message)
        self.type = kind  # "requests" (requests a minute, or in flight) or "tokens"
        self.retry_after_s = retry_after_s
        self.limit_headers = limit_headers

    def response_headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after_s), **self.limit_headers}


class PayloadTooLarge(InvalidRequest):
    status = 413
    code = "payload_too_large"
    # The rest of the body is not read; without this the server would go on reading and
    # discarding it for as long as the client sends (1 GiB in a test) to keep the
    # connection alive for a next request that never comes.
    headers: ClassVar[dict[str, str]] = {"connection": "close"}


class MemoryUnavailable(GatewayError):
    status = 503
    type = "memory_unavailable"
    code = "redis_unavailable"


class KeysUnavailable(GatewayError):
    """The admin API's keys could not be read for ``auth.stale_after_s``: a key made
    there is not taken (it may have been revoked meanwhile)."""

    status = 503
    type = "service_unavailable"
    code = "keys_unavailable"


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"


class UpstreamUnreachable(UpstreamError):
    code = "upstream_unreachable"


class UpstreamPoolFull(UpstreamError):
    """Every upstream connection (``upstream.max_connections``) stayed busy for
    ``upstream.timeouts.pool_s``: answered at once rather than after the connect timeout,
    so a client retries soon instead of piling up behind the streams that hold them."""

    status = 503
    code = "upstream_pool_full"
    headers: ClassVar[dict[str, str]] = {"retry-after": "1"}


class UpstreamTimeout(UpstreamError):
    status = 504
    type = "upstream_timeout"
    code = "upstream_timeout"


class SummarizerUnavailable(Exception):
    """The summarizer model could not answer (unreachable, timeout, non-200, bad body)."""


class EmbeddingsUnavailable(Exception):
    """The embeddings model failed or did not answer in time: recall keeps its order."""


# A refusal (429: past a rate limit, a tenant's concurrency or an address's connection
# cap) is answered after a random part of this: clients refused together and retrying at
# once then come back spread out rather than as one burst that holds the event loop.
REFUSAL_SPREAD_S = 1.0


def error_body(
    message: str, type_: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# Anthropic's error types by status (its SDKs pick an exception by status, show the type).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_error(kind: str, message: str) -> dict[str, Any]:
    """An error in Anthropic's envelope: ``{"type": "error", "error": {"type", "message"}}``
    (a body's, or an ``error`` event's data)."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_body(status: int, message: str) -> dict[str, Any]:
    """An error answered with ``status``, in Anthropic's envelope and its type for it."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return anthropic_error(kind, message)


def sse_error_event(message: str, type_: str, code: str | None) -> bytes:
    """An in-band error for a stream whose headers are already sent (OpenAI's shape)."""
    payload = json.dumps(error_body(message, type_, code=code), separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
