"""The one way a request reaches Redis: ``RedisLink.execute(commands, deadline=...)``.

Every Redis call made while serving a client request (a proxied turn's load and record,
recall's reads, the memory API, rate limits, the inspector's login) is a list of plain
argv tuples sent here, and comes back as the replies Redis sent, in order (an error reply
in its place, as an exception object). The link is ``connections`` (a few shared,
pipelined connections) on a single Redis, ``cluster`` (the same, per master, with
``MOVED``/``ASK`` followed) on a Redis Cluster.

The deadline is one mechanism, the connections': how long Redis may stay silent on the
call's connection (see ``connections``); past it, ``TimeoutError``. Each call names its
operation (``op``, the store's name for it): one who watches the link (a test counting a
turn's round trips) sees what each round trip was for.

redis-py is used here only to connect and, on a cluster, for the slot map; the private
parts of it the connections need are in ``gateway.compat.redis``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster

from gateway.store.cluster import ClusterConnections
from gateway.store.connections import MAX_QUEUED_S, Connections

# One Redis command: its name and arguments (str, bytes, int or float).
Command = tuple[Any, ...]

__all__ = ["MAX_QUEUED_S", "Command", "RedisLink"]


class RedisLink:
    """Connections to the Redis (or Redis Cluster) ``client`` points at: made as
    ``client`` makes its own, never checked out of its pool. The store has two: the
    request path's, and the background's (``with_deadline``), on other connections."""

    def __init__(self, client: Any) -> None:
        self._connections: Connections | ClusterConnections = (
            ClusterConnections(client)
            if isinstance(client, RedisCluster)
            else Connections(client.connection_pool)
        )

    async def execute(
        self, commands: Sequence[Command], *, deadline: float | None, op: str
    ) -> list[Any]:
        """The commands' replies, in order, in one round trip (one per master a cluster's
        commands reach, all at once) for the store's operation ``op``. ``deadline``:
        seconds Redis may stay silent (None: the caller bounds the call). Raises
        ``TimeoutError`` past it, redis-py's ``ConnectionError`` when the connection is
        lost."""
        return await self._connections.execute(commands, deadline)

    async def per_server(
        self, commands: Sequence[Command], *, deadline: float | None, op: str
    ) -> None:
        """The commands once on each server (loading scripts); an error reply raises."""
        await self._connections.per_server(commands, deadline)

    async def warm(self, *, deadline: float | None) -> None:
        """Every connection open, so that a burst of first calls does not wait for them."""
        await self._connections.warm(deadline)

    async def aclose(self) -> None:
        await self._connections.aclose()
