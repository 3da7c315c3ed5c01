"""The private parts of aiohttp the upstream client relies on, in one place.

Each is load-bearing and none has a public equivalent:

- ``ClientSession._retry_connection``: aiohttp resends an idempotent request once when a
  kept-alive connection turns out closed; a proxy must not (a request that reached the
  upstream may have been billed), so ``without_retries`` switches it off;
- ``BaseConnector._wait_for_available_connection``: the wait for a pooled connection when
  all are busy, which aiohttp bounds only together with the TCP connect;
  ``BoundedWaitConnector`` bounds it on its own. (aiohttp's public tracing signals can
  tell a request is waiting, but every request then pays for them: ~16 µs of CPU each;
  this costs nothing until the pool is full.);
- ``StreamReader._buffer``: what arrived before a connection broke, which aiohttp's reads
  no longer return (``take_buffered``);
- ``StreamWriter.write``'s drain threshold (its ``LIMIT``): below it a write returns
  without waiting for the transport (``WRITE_DRAIN_BYTES``).

All are checked here, at import: an aiohttp outside the tested range, or one that renamed
any of them, fails at start-up rather than silently retrying billed requests or leaving a
wait unbounded.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import aiohttp
from aiohttp.http_writer import StreamWriter

from gateway.compat.versions import require

TESTED = ((3, 12), (3, 15))

VERSION = require(
    "aiohttp",
    *TESTED,
    uses="ClientSession._retry_connection, BaseConnector._wait_for_available_connection, "
    "StreamReader._buffer and StreamWriter.write's drain limit",
)

_WAIT = "_wait_for_available_connection"


def _drain_limit() -> int:
    limit = inspect.signature(StreamWriter.write).parameters.get("LIMIT")
    if limit is None or not isinstance(limit.default, int):
        raise RuntimeError(f"aiohttp {VERSION}: StreamWriter.write has no LIMIT any more")
    return limit.default


# aiohttp's writer waits for the transport to drain only past this many bytes written
# since the last drain; below it a write returns without waiting.
WRITE_DRAIN_BYTES = _drain_limit()


def check_private_names() -> None:
    """Raises ``RuntimeError`` naming what the installed aiohttp no longer has."""
    if not hasattr(aiohttp.TCPConnector, _WAIT):
        raise RuntimeError(f"aiohttp {VERSION} no longer has {_WAIT}: cannot bound the pool wait")
    if "_retry_connection" not in getattr(aiohttp.ClientSession, "ATTRS", ()):
        raise RuntimeError(f"aiohttp {VERSION} no longer has _retry_connection")


check_private_names()


class PoolWaitExpired(Exception):
    """No pooled connection came free within the connector's ``pool_s``."""


class BoundedWaitConnector(aiohttp.TCPConnector):
    """A connector whose wait for a free connection (all ``limit`` busy) ends after
    ``pool_s`` with ``PoolWaitExpired``."""

    def __init__(self, *, pool_s: float, **options: Any) -> None:
        # Checked again here: a test (or a later import) may have taken it away.
        if not hasattr(aiohttp.TCPConnector, _WAIT):
            raise RuntimeError(f"aiohttp {VERSION} no longer has {_WAIT}")
        super().__init__(**options)
        self.pool_s = pool_s

    async def _wait_for_available_connection(self, *args: Any, **kwargs: Any) -> None:
        try:
            async with asyncio.timeout(self.pool_s):
                await super()._wait_for_available_connection(*args, **kwargs)
        except TimeoutError:
            raise PoolWaitExpired from None


def without_retries(session: aiohttp.ClientSession) -> aiohttp.ClientSession:
    """``session``, which now never resends a request on a connection found closed."""
    if not hasattr(session, "_retry_connection"):
        raise RuntimeError(f"aiohttp {VERSION} no longer has _retry_connection")
    session._retry_connection = False
    return session


def take_buffered(content: aiohttp.StreamReader) -> bytes:
    """The bytes that arrived before the connection broke, taken out of the reader
    (after a break aiohttp's reads raise at once and leave them in its buffer)."""
    buffer = getattr(content, "_buffer", None)
    if not buffer:
        return b""
    data = b"".join(bytes(part) for part in buffer)
    buffer.clear()
    return data
