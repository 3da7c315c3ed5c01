"""A request refused by a middleware, before any route: the error in OpenAI's envelope,
and a 429 sent after a random part of a second, counted against its client address when it
was its connection's first (``refused_addresses``: an address whose new connections are
refused again and again is turned away when it connects).

Refusals that arrive together (a client's connections reopened at once, its kept-alive
ones timing out together) then end apart, and its retries with them, instead of coming
back as one burst that every other client's requests wait behind (``REFUSAL_SPREAD_S``).
"""

from __future__ import annotations

import asyncio
import random

from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from gateway.errors import REFUSAL_SPREAD_S, GatewayError, TooManyRequests
from gateway.http.refused_addresses import NEW_CONNECTION, REFUSED
from gateway.observability import request_log


def error_response(error: GatewayError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.response_headers())


async def refuse(error: TooManyRequests, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer a limit's 429, noted on the access line, after a random part of a second."""
    request_log.note(rate_limited=error.type)
    first = (scope.get("extensions") or {}).get(NEW_CONNECTION)
    if first is not None:
        REFUSED.note(first["key"])
    await asyncio.sleep(random.uniform(0, REFUSAL_SPREAD_S))
    await error_response(error)(scope, receive, send)
