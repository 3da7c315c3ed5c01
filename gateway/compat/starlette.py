"""The undocumented parts of Starlette the gateway relies on, in one place.

- ``Starlette.build_middleware_stack``: the request middleware (id, metrics, access line)
  goes outside Starlette's own error middleware, so that a 500 is counted and logged as
  one (``OutermostStarlette``);
- ``StreamingResponse.stream_response``: a relayed stream is sent without Starlette's
  anyio task group, its disconnect watched by one plain task (``routes.relay``);
- ``scope["route"]``: the route the router matched, which names a request in metrics and
  the access line (``matched_path``).

The installed Starlette is checked against the range this was tested with, and the
methods at import.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable

from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Scope, Send

from gateway.compat.versions import require

TESTED = ((1, 0), (1, 11))

VERSION = require(
    "starlette",
    *TESTED,
    uses="Starlette.build_middleware_stack, StreamingResponse.stream_response and "
    'the router\'s scope["route"]',
)


def check_methods() -> None:
    """Raises ``RuntimeError`` naming a method the installed Starlette lacks."""
    if not inspect.iscoroutinefunction(getattr(StreamingResponse, "stream_response", None)):
        raise RuntimeError(f"starlette {VERSION}: StreamingResponse.stream_response is gone")
    if not callable(getattr(Starlette, "build_middleware_stack", None)):
        raise RuntimeError(f"starlette {VERSION}: Starlette.build_middleware_stack is gone")


check_methods()


class OutermostStarlette(Starlette):
    """Starlette whose whole middleware stack, its error middleware included, is wrapped
    by ``outermost``."""

    def outermost(self, app: ASGIApp) -> ASGIApp:
        return app

    def build_middleware_stack(self) -> ASGIApp:
        return self.outermost(super().build_middleware_stack())


def stream_body(response: StreamingResponse, send: Send) -> Awaitable[None]:
    """Sends ``response`` (start, body, end) and nothing else: no disconnect watch."""
    return response.stream_response(send)


def matched_path(scope: Scope) -> str | None:
    """The path of the route that took the request; None when none did."""
    return getattr(scope.get("route"), "path", None)
