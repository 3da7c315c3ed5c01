"""The private parts of redis-py the request path's link uses, in one place.

redis-py connects (TLS, unix sockets, AUTH, SELECT, the protocol handshake); the link
then takes the connection's transport (``StreamWriter.transport``, private in redis-py's
connection: ``_writer``) and parses replies with hiredis, raising redis-py's own error
classes (``BaseParser.parse_error``, in the private ``redis._parsers``: NOSCRIPT as
``NoScriptError``, MOVED as ``MovedError``). On a Redis Cluster the link routes each
command by the slot map of redis-py's ``RedisCluster``, kept by its undocumented
``nodes_manager`` (``SlotMap`` below). All are checked here against the versions tested:
a redis-py outside that range fails at import with a clear message instead of on the
first request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import hiredis
import redis
from redis._parsers import BaseParser
from redis.asyncio.cluster import ClusterNode, NodesManager, RedisCluster
from redis.exceptions import InvalidResponse, MovedError

from gateway.compat.versions import require

# The redis-py versions this module was tested with: [low, high).
TESTED = ((8, 1), (9, 0))

VERSION = require(
    "redis",
    *TESTED,
    uses=(
        "a connection's transport (its _writer), redis._parsers.BaseParser.parse_error and "
        "RedisCluster.nodes_manager (get_node_from_slot, move_slot, initialize, "
        "get_nodes_by_server_type, get_node, connection_kwargs)"
    ),
)

# Where a redis-py connection keeps what it opened, and how an error reply becomes one of
# its exception classes: checked at import, so that a renamed attribute fails here.
if not callable(getattr(BaseParser, "parse_error", None)):  # pragma: no cover
    raise ImportError(f"redis-py {redis.__version__}: BaseParser.parse_error is gone")

parse_error: Callable[[str], Exception] = BaseParser.parse_error

# What ``SlotMap`` uses of the slot map: its methods, and the settings a node it did not
# know is made with (declared in the class's ``__slots__``: seen without an instance).
NODES_MANAGER_METHODS = (
    "get_node_from_slot",
    "move_slot",
    "initialize",
    "get_nodes_by_server_type",
    "get_node",
)
NODES_MANAGER_ATTRIBUTES = ("connection_kwargs",)


def missing_parts(nodes_manager: type) -> list[str]:
    """What ``SlotMap`` uses that the class ``nodes_manager`` lacks."""
    missing = [
        name for name in NODES_MANAGER_METHODS if not callable(getattr(nodes_manager, name, None))
    ]
    missing += [name for name in NODES_MANAGER_ATTRIBUTES if not hasattr(nodes_manager, name)]
    return missing


if _missing := missing_parts(NodesManager):  # pragma: no cover
    raise ImportError(f"redis-py {redis.__version__}: NodesManager lacks {', '.join(_missing)}")


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


class SlotMap:
    """A cluster client's slot map (its private ``nodes_manager``), as the link routes by
    it: the master of a slot, every master, a slot moved (``MOVED``), the map read again."""

    def __init__(self, cluster: RedisCluster) -> None:
        self._cluster = cluster

    @property
    def _nodes(self) -> NodesManager:
        return self._cluster.nodes_manager

    def master_of(self, slot: int) -> ClusterNode:
        return self._nodes.get_node_from_slot(slot)

    def masters(self) -> list[ClusterNode]:
        return self._nodes.get_nodes_by_server_type("primary")

    def node_at(self, host: str, port: int) -> ClusterNode:
        """The node at ``host``:``port`` (an ``ASK`` redirection's), known or new."""
        known = self._nodes.get_node(host=host, port=port)
        return known or ClusterNode(host, port, **self._nodes.connection_kwargs)

    async def moved(self, error: MovedError) -> None:
        """The map corrected from a ``MOVED`` reply."""
        await self._nodes.move_slot(error)

    async def reread(self) -> None:
        """The map read again from the cluster (a master down: a replica promoted)."""
        await self._nodes.initialize()
