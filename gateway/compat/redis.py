"""The private parts of redis-py the request path's link uses, in one place.

redis-py connects (TLS, unix sockets, AUTH, SELECT, the protocol handshake); the link
then takes the connection's transport (``StreamWriter.transport``, private in redis-py's
connection: ``_writer``) and parses replies with hiredis, raising redis-py's own error
classes (``BaseParser.parse_error``, in the private ``redis._parsers``: NOSCRIPT as
``NoScriptError``, MOVED as ``MovedError``). Both are checked here against the versions
tested: a redis-py outside that range fails at import with a clear message instead of on
the first request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import hiredis
import redis
from redis._parsers import BaseParser
from redis.exceptions import InvalidResponse

from gateway.compat.versions import require

# The redis-py versions this module was tested with: [low, high).
TESTED = ((8, 1), (9, 0))

VERSION = require(
    "redis",
    *TESTED,
    uses="a connection's transport (its _writer) and redis._parsers.BaseParser.parse_error",
)

# Where a redis-py connection keeps what it opened, and how an error reply becomes one of
# its exception classes: checked at import, so that a renamed attribute fails here.
if not callable(getattr(BaseParser, "parse_error", None)):  # pragma: no cover
    raise ImportError(f"redis-py {redis.__version__}: BaseParser.parse_error is gone")

parse_error: Callable[[str], Exception] = BaseParser.parse_error


def reply_reader(connection: Any, incomplete: object) -> Any:
    """A hiredis reader for ``connection``'s replies (its decoding), with redis-py's error
    classes for error replies; ``incomplete``: what ``gets()`` returns without a whole
    reply buffered."""
    encoder = connection.encoder
    decoding = (
        {"encoding": encoder.encoding, "errors": encoder.encoding_errors}
        if encoder.decode_responses
        else {}
    )
    return hiredis.Reader(
        protocolError=InvalidResponse,
        replyError=parse_error,
        notEnoughData=incomplete,
        **decoding,
    )


def take_transport(
    connection: Any, protocol: asyncio.Protocol
) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
    """Points the transport of ``connection`` (connected, nothing buffered) at
    ``protocol``. Returns the transport, and redis-py's own protocol, which must still be
    told of the close (``disconnect`` waits for it). The transport stays the
    connection's: redis-py closes it."""
    writer = getattr(connection, "_writer", None)
    if writer is None:
        raise RuntimeError(f"redis-py {redis.__version__}: the connection holds no writer")
    transport: asyncio.Transport = writer.transport
    previous = transport.get_protocol()
    transport.set_protocol(protocol)
    return transport, previous
