"""The HTTP/1.1 server protocol: uvicorn's httptools one, with a bound on a request's head.

httptools (llhttp) is the faster of uvicorn's two parsers: ~0.1 ms less a request than
h11 on a trivial app, a tenth of the passthrough path's cost. But it buffers a request's
line and headers without any limit: an 8 MiB ``X-Session-Id`` was read whole and
answered. This protocol counts the bytes of a head as they arrive and answers 400 (and
closes) once ``server.max_header_bytes`` pass without the head's end, before more is
parsed.

Notes:
    The limit comes through uvicorn's own ``h11_max_incomplete_event_size`` option (the
    same bound for h11: a head is its one large incomplete event), so the class needs no
    configuration of its own and ``serve --workers N`` passes it to every process.

    Bytes are counted per ``data_received``; when a read holds the end of one request's
    body and the start of the next request's head, that read's head bytes are not
    counted. One read is at most the event loop's read size (256 KiB with uvloop), so a
    head is still bounded.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

TOO_LARGE = "Request line and headers too large."


class BoundedHeadProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol that refuses a request head past a size."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.max_head_bytes: int = config.h11_max_incomplete_event_size or 64 * 1024
        self.head_bytes = 0
        self.reading_head = True
        self.heads = 0  # request heads read whole on this connection

    def data_received(self, data: bytes) -> None:
        if not self.reading_head:
            super().data_received(data)
            return
        room = self.max_head_bytes - self.head_bytes
        if len(data) <= room:
            self.head_bytes += len(data)
            super().data_received(data)
            return
        self.head_bytes = self.max_head_bytes
        heads = self.heads
        super().data_received(data[:room])
        if self.transport.is_closing():  # the parser refused the head already
            return
        if self.heads == heads:  # no end of the head within the limit
            self.logger.warning(TOO_LARGE)
            self.send_400_response(TOO_LARGE)
            return
        self.data_received(data[room:])  # the body, and maybe the next request's head

    def on_headers_complete(self) -> None:
        self.reading_head = False
        self.heads += 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.reading_head = True
        self.head_bytes = 0
