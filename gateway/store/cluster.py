"""The request path's shared connections on a Redis Cluster: the links of ``connections``,
one set per master, each command sent to the master of its key's slot.

A call's commands are grouped by master and the groups are written at once, so a round
trip is still one wait (the slowest master's). Every key of a session shares one hash
tag: its scripts run whole on one master. The user's keys and the job-stream shard a
notice goes to may live on others; a command never spans two slots.

redis-py's ``RedisCluster`` keeps the slot map (read from the cluster at start), shared
with the client the rest of the store uses; its private parts are reached through
``gateway.compat.redis.SlotMap``:

* ``MOVED`` (a slot that moved: a failover, a resharding): the command did not run. The
  map is corrected from the reply and the command sent to the slot's new master, once.
* ``ASK`` (a slot being migrated): the command did not run; it is sent once, after
  ``ASKING``, to the node named.
* A master that cannot be reached fails its commands (their replies are the error; the
  other masters' commands did run, and the caller decides) and the map is read again in
  the background: once a replica is promoted, the next calls go to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, RedisError

from gateway.compat.redis import SlotMap
from gateway.store.connections import LINKS, Connections

# Commands whose first key is not their first argument.
_SCRIPT_CALLS = frozenset({"EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO"})
_SUBCOMMANDS = frozenset({"MEMORY", "XINFO", "OBJECT", "XGROUP"})  # key after a subcommand
_KEYLESS = frozenset({"PING", "TIME", "INFO", "CONFIG", "SCRIPT", "ECHO"})


def slot_of(command: Sequence[Any]) -> int | None:
    """The hash slot of a command's key; None for a command without one (``PING``)."""
    name = str(command[0]).upper()
    if name in _SCRIPT_CALLS:
        key = command[3] if int(command[2]) > 0 else None
    elif name in _SUBCOMMANDS:
        key = command[2] if len(command) > 2 else None
    else:
        key = command[1] if len(command) > 1 and name not in _KEYLESS else None
    if key is None:
        return None
    return key_slot(key.encode() if isinstance(key, str) else bytes(key))


class ClusterConnections:
    """``LINKS`` shared connections to each master of ``cluster``, made as the cluster
    client makes its own (same class and settings), without a socket timeout: the
    store's deadline bounds each call."""

    def __init__(self, cluster: RedisCluster, links: int = LINKS) -> None:
        self._cluster = cluster
        self._slots = SlotMap(cluster)
        self._size = links
        self._masters: dict[str, Connections] = {}
        self._initialized = False
        self._refreshing: asyncio.Task[None] | None = None

    async def execute(
        self, commands: Sequence[tuple[Any, ...]], timeout_s: float | None = None
    ) -> list[Any]:
        """Each command on its slot's master, all at once; the replies in order.
        ``timeout_s``: each master's deadline (see ``Connections.execute``)."""
        await self._initialize()
        groups: dict[str, tuple[ClusterNode, list[int]]] = {}
        for at, command in enumerate(commands):
            slot = slot_of(command)
            node = self._slots.master_of(slot) if slot is not None else self._any_master()
            groups.setdefault(node.name, (node, []))[1].append(at)
        replies: list[Any] = [None] * len(commands)

        async def send(node: ClusterNode, ats: list[int]) -> None:
            got = await self._on(node).execute([commands[at] for at in ats], timeout_s)
            for at, reply in zip(ats, got, strict=True):
                replies[at] = reply

        sent = await asyncio.gather(
            *(send(node, ats) for node, ats in groups.values()), return_exceptions=True
        )
        for (_, ats), outcome in zip(groups.values(), sent, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, RedisError | OSError):
                    raise outcome
                # A master down: its replica may be promoted meanwhile. The commands sent
                # to the other masters did run: the caller learns which did not.
                self._refresh()
                for at in ats:
                    replies[at] = outcome
        for at, reply in enumerate(replies):
            if isinstance(reply, AskError):  # MOVED included (a subclass)
                replies[at] = await self._redirected(commands[at], reply, timeout_s)
        return replies

    async def per_server(
        self, commands: Sequence[tuple[Any, ...]], timeout_s: float | None = None
    ) -> None:
        """The commands once on every master (loading the scripts)."""
        await self._initialize()
        await asyncio.gather(
            *(self._on(node).per_server(commands, timeout_s) for node in self._all())
        )

    async def warm(self, timeout_s: float | None = None) -> None:
        """Every link to every master open."""
        await self._initialize()
        await asyncio.gather(*(self._on(node).warm(timeout_s) for node in self._all()))

    async def _redirected(
        self, command: tuple[Any, ...], error: AskError, timeout_s: float | None
    ) -> Any:
        if isinstance(error, MovedError):
            await self._slots.moved(error)
            node = self._slots.master_of(error.slot_id)
            (reply,) = await self._on(node).execute([command], timeout_s)
            return reply
        node = self._slots.node_at(error.host, error.port)
        _, reply = await self._on(node).execute([("ASKING",), command], timeout_s)
        return reply

    def _on(self, node: ClusterNode) -> Connections:
        links = self._masters.get(node.name)
        if links is None:
            links = self._masters[node.name] = Connections(node, self._size)
        return links

    def _any_master(self) -> ClusterNode:
        return self._all()[0]

    def _all(self) -> list[ClusterNode]:
        return self._slots.masters()

    async def _initialize(self) -> None:
        if not self._initialized:
            await self._cluster.initialize()
            self._initialized = True

    def _refresh(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._reread_map())

    async def _reread_map(self) -> None:
        with contextlib.suppress(RedisError, OSError):  # the next failed call tries again
            await self._slots.reread()

    async def aclose(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            await asyncio.gather(self._refreshing, return_exceptions=True)
        masters, self._masters = list(self._masters.values()), {}
        for links in masters:
            await links.aclose()
