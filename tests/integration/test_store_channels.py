"""The store's two channels (gateway/store/calls.py, gateway/wiring.py), on a real Redis:
background calls (``with_deadline``: the worker, the memory API) go out on connections of
their own, and the request path's connects give up in about a second."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from devsupport.servers import RedisProcess
from gateway.config import Settings
from gateway.store.calls import StoreCalls, StoreUnavailable, create_client
from gateway.store.connections import LINKS
from gateway.store.link import MAX_QUEUED_S, RedisLink
from gateway.wiring import build_clients


@pytest.fixture
async def calls(redis_server: RedisProcess) -> AsyncIterator[StoreCalls]:
    """The store's calls over one client, as tests and the dev gateways make them."""
    opened = StoreCalls(
        create_client(redis_server.url, timeout_s=2, max_connections=4),
        timeout_s=2,
        retention_s=3600,
    )
    yield opened
    await opened.close()


async def _connection_ids(calls: StoreCalls) -> set[int]:
    """The server's ids of the connections ``calls`` sends on: its link's ``LINKS``
    connections, opened, then each asked in turn (the link takes them round robin)."""
    await calls.warm(timeout_s=2)
    ids = set()
    for _ in range(2 * LINKS):
        (reply,) = await calls.execute([("CLIENT", "ID")], op="test")
        ids.add(reply)
    assert len(ids) == LINKS  # every connection asked: the sets below are whole
    return ids


async def test_background_calls_go_out_on_other_connections_than_the_request_paths(
    calls: StoreCalls,
) -> None:
    request = await _connection_ids(calls)
    background = await _connection_ids(calls.with_deadline(5))
    assert request.isdisjoint(background)


async def test_every_background_view_shares_one_set_of_connections(calls: StoreCalls) -> None:
    first = await _connection_ids(calls.with_deadline(5))
    # A view of a view, and another deadline: the same connections, not new ones.
    assert await _connection_ids(calls.with_deadline(1).with_deadline(2)) == first


async def test_a_background_call_given_up_leaves_the_request_paths_connections_alone(
    calls: StoreCalls, redis_server: RedisProcess
) -> None:
    request = await _connection_ids(calls)
    background = calls.with_deadline(0.05)
    await _connection_ids(background)
    admin = redis_server.client()
    try:
        admin.client_pause(300, all=True)
        with pytest.raises(StoreUnavailable, match="TimeoutError"):
            await background.execute([("PING",)], op="test")  # its connection drains
        admin.client_unpause()
    finally:
        admin.close()
    assert await _connection_ids(calls) == request


@pytest.fixture
def dropping_syns() -> Iterator[str]:
    """A Redis url whose host drops connection attempts (SYN): a listener whose accept
    queue is full and never read, as a host that went away looks to a client."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filling = []
    for _ in range(4):  # more than the queue holds: the next attempts are dropped
        attempt = socket.socket()
        attempt.setblocking(False)
        with contextlib.suppress(BlockingIOError):  # under way, and stays so
            attempt.connect(("127.0.0.1", port))
        filling.append(attempt)
    yield f"redis://127.0.0.1:{port}/0"
    for attempt in filling:
        attempt.close()
    listener.close()


def _recording(made: list[RedisLink]) -> Callable[[object], RedisLink]:
    def link(client: object) -> RedisLink:
        made.append(RedisLink(client))
        return made[-1]

    return link


async def test_the_request_paths_connect_gives_up_in_about_a_second(dropping_syns: str) -> None:
    settings = Settings()
    made: list[RedisLink] = []
    clients = build_clients(settings, dropping_syns, link=_recording(made))
    request_link = made[0]
    expected = settings.redis.timeout_ms / 1000 + MAX_QUEUED_S  # not the background's 6 s
    started = time.monotonic()
    try:
        with pytest.raises(RedisTimeoutError, match="connecting"):
            # No deadline of the call's: only the connect's own timeout ends it.
            await request_link.execute([("PING",)], deadline=None, op="test")
        elapsed = time.monotonic() - started
        assert expected - 0.1 <= elapsed < expected + 1.5, elapsed
    finally:
        await clients.aclose()


async def test_on_a_cluster_the_first_call_gives_up_in_about_a_second(
    dropping_syns: str,
) -> None:
    # The slot map is read at the first call, with the request client's connect timeout.
    settings = Settings.model_validate({"redis": {"cluster": True, "url": dropping_syns}})
    clients = build_clients(settings, dropping_syns)
    expected = settings.redis.timeout_ms / 1000 + MAX_QUEUED_S
    started = time.monotonic()
    try:
        # redis-py's "cannot be connected" is no RedisError; the store makes it StoreUnavailable.
        with pytest.raises(StoreUnavailable):
            await clients.store.server.ping()
        elapsed = time.monotonic() - started
        assert elapsed < expected + 1.5, elapsed
    finally:
        await asyncio.wait_for(clients.aclose(), 5)
