"""Counting a gateway's Redis round trips, by the store method that made each.

A round trip is one write of commands to a Redis connection followed by reading their
replies: one command, one pipeline or one script call.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio.connection import Connection

import gateway.store
from devsupport.gateways import build_settings
from devsupport.servers import RedisProcess, ServerThread
from gateway.store.connections import _Link
from gateway.wiring import build_clients

_STORE = Path(gateway.store.__file__).parent


class RoundTrips:
    """Every round trip the counted connections made, by the store method that made it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def count_request_path(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The request path's shared connections: a round trip is one call's send."""
        calls = self.calls
        send = _Link.send

        def counted(link: _Link, packed: bytes, waiting: Any) -> None:
            calls.append(_store_method())
            send(link, packed, waiting)

        monkeypatch.setattr(_Link, "send", counted)

    def connection_class(self) -> type[Connection]:
        calls = self.calls

        class Counting(Connection):
            async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                # A new connection's handshake is the connection's, once, not a request's.
                if not any(f.function.startswith("on_connect") for f in inspect.stack(context=0)):
                    calls.append(_store_method())
                await super().send_packed_command(command, check_health)

        return Counting


def _store_method() -> str:
    """The store method the round trip was for (the outermost frame of ``gateway/store/``
    on the stack)."""
    names = [f.function for f in inspect.stack(context=0) if _STORE in Path(f.filename).parents]
    return names[-1] if names else "?"


@contextmanager
def counted_gateways(
    upstream_url: str, redis_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, RoundTrips]]:
    """Gateways whose Redis connections count their round trips."""
    started: list[ServerThread] = []
    trips = RoundTrips()
    trips.count_request_path(monkeypatch)

    def make(preset: str, **memory: Any) -> ServerThread:
        # Jobs stay pending (no in-process worker), so the test can see they were enqueued.
        settings = build_settings(
            upstream_url,
            redis_server.url,
            memory={"preset": preset, **memory},
            worker={"in_process": False},
        )
        clients = build_clients(settings, settings.redis.url)
        clients.store.client.connection_pool.connection_class = trips.connection_class()
        thread = ServerThread(clients.create_app(settings), on_stop=clients.aclose).start()
        started.append(thread)
        return thread

    try:
        yield make, trips
    finally:
        for thread in started:
            thread.stop()
