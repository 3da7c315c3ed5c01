"""The private parts of uvicorn the HTTP server protocol (``gateway.http.server``) builds
on, in one place.

``BoundedHeadProtocol`` subclasses uvicorn's httptools protocol
(``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol``, not a public API) to bound a
request's head, a client's time and its connections. Besides the methods it overrides
(``HOOKS``), it reads the protocol's state: ``transport``, ``loop``, ``client``,
``logger``, ``server_state`` (a ``uvicorn.server.ServerState``: its ``default_headers``),
``flow`` (``read_paused``, ``pause_reading``; it replaces it with a ``FlowControl``
subclass that reports when reading resumes) and ``cycle`` (``response_started``,
``response_complete``, ``keep_alive``, ``disconnected``, ``message_event``); and it writes
its own answers with the status lines uvicorn writes (``STATUS_LINE``).

The installed uvicorn is checked against the range this was tested with, and the hooks
at import; the state is checked by ``tests/unit/test_compat.py`` on a real protocol instance.
"""

from __future__ import annotations

from uvicorn.config import Config as Config
from uvicorn.protocols.http.flow_control import FlowControl as FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE as STATUS_LINE
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as HttpToolsProtocol
from uvicorn.server import ServerState as ServerState

from gateway.compat.versions import require

TESTED = ((0, 30), (0, 55))

VERSION = require(
    "uvicorn",
    *TESTED,
    uses="its httptools protocol's internals (uvicorn.protocols.http.httptools_impl), "
    "ServerState and STATUS_LINE",
)

# The protocol's methods the gateway's subclass overrides or calls.
HOOKS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_headers_complete",
    "on_message_complete",
    "send_400_response",
    "pause_writing",
    "resume_writing",
)


def check_hooks() -> None:
    """Raises ``RuntimeError`` naming a hook the installed uvicorn's protocol lacks."""
    missing = [name for name in HOOKS if not callable(getattr(HttpToolsProtocol, name, None))]
    if missing:
        raise RuntimeError(f"uvicorn {VERSION}: HttpToolsProtocol has no {', '.join(missing)}")
    if not callable(getattr(FlowControl, "resume_reading", None)):
        raise RuntimeError(f"uvicorn {VERSION}: FlowControl has no resume_reading")
    if 400 not in STATUS_LINE or not isinstance(STATUS_LINE[400], bytes):
        raise RuntimeError(f"uvicorn {VERSION}: STATUS_LINE is not a table of status lines")


check_hooks()
