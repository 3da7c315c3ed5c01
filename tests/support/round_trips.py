"""Counting a gateway's Redis round trips, by the store operation that made each.

A round trip is one write of commands to a Redis connection followed by reading their
replies: one command, one pipeline or one script call. Every store call goes through its
one link (``gateway.store.link``), which each call names (``op``): the gateways here get a
link that notes each call's name, and a client that notes any command sent around the
link (on the request path there should be none).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from devsupport.gateways import build_settings
from devsupport.servers import RedisProcess, ServerThread
from gateway.store.link import Command, RedisLink
from gateway.wiring import build_clients


class CountingLink(RedisLink):
    """A store's link that notes the operation of every round trip it makes."""

    def __init__(self, client: Any, calls: list[str]) -> None:
        super().__init__(client)
        self.calls = calls

    async def execute(
        self, commands: Sequence[Command], *, deadline: float | None, op: str
    ) -> list[Any]:
        self.calls.append(op)
        return await super().execute(commands, deadline=deadline, op=op)

    async def per_server(
        self, commands: Sequence[Command], *, deadline: float | None, op: str
    ) -> None:
        self.calls.append(op)
        await super().per_server(commands, deadline=deadline, op=op)


class RoundTrips:
    """Every round trip the counted gateways made, by the store operation that made it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def link(self, client: Any) -> RedisLink:
        """A store's link, counted; and its client's own commands (around the link)
        counted as ``client:<COMMAND>``."""
        client.execute_command = self._counted(client.execute_command)
        return CountingLink(client, self.calls)

    def _counted(self, execute: Callable[..., Any]) -> Callable[..., Any]:
        async def counted(*args: Any, **options: Any) -> Any:
            self.calls.append(f"client:{args[0]}")
            return await execute(*args, **options)

        return counted


@contextmanager
def counted_gateways(
    upstream_url: str, redis_server: RedisProcess
) -> Iterator[tuple[Any, RoundTrips]]:
    """Gateways whose store counts its round trips (``make(preset, clock=...)``: the
    time the app reads, a test's own to step)."""
    started: list[ServerThread] = []
    trips = RoundTrips()

    def make(preset: str, clock: Callable[[], float] = time.time, **memory: Any) -> ServerThread:
        # Jobs stay pending (no in-process worker), so the test can see they were enqueued.
        settings = build_settings(
            upstream_url,
            redis_server.url,
            memory={"preset": preset, **memory},
            worker={"in_process": False},
            # A configured tenant secret: no poll keeping it in Redis every
            # auth.refresh_s, whose round trips would be counted with a request's.
            server={"tenant_secret": "a-tenant-secret-of-the-counted-gateways"},
        )
        clients = build_clients(settings, settings.redis.url, clock=clock, link=trips.link)
        thread = ServerThread(clients.create_app(settings), on_stop=clients.aclose).start()
        started.append(thread)
        return thread

    try:
        yield make, trips
    finally:
        for thread in started:
            thread.stop()
