"""The request path's plain connection pool (gateway/store/connections.py), on a real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.exceptions import ResponseError

from gateway.store.connections import Connections
from gateway.store.redis_store import create_client
from tests.support.servers import RedisProcess

pytestmark = pytest.mark.integration


@pytest.fixture
async def connections(redis_server: RedisProcess) -> AsyncIterator[Connections]:
    client = create_client(redis_server.url, timeout_s=2, max_connections=2)
    opened = Connections(client.connection_pool)
    yield opened
    await opened.aclose()
    await client.aclose()


async def test_replies_come_back_in_order_as_redis_sent_them(connections: Connections) -> None:
    replies = await connections.execute(
        [("SET", "conn:a", "1"), ("RPUSH", "conn:l", "x", "y"), ("LRANGE", "conn:l", 0, -1),
         ("SMEMBERS", "conn:none"), ("DEL", "conn:a", "conn:l")]
    )  # fmt: skip
    assert replies == [b"OK", 2, [b"x", b"y"], [], 2]  # SMEMBERS: a list, not a set


async def test_an_error_reply_takes_its_place_and_the_rest_still_run(
    connections: Connections,
) -> None:
    replies = await connections.execute(
        [("SET", "conn:e", "1"), ("NOSUCHCOMMAND",), ("GET", "conn:e"), ("DEL", "conn:e")]
    )
    assert replies[0] == b"OK" and replies[2] == b"1"
    assert isinstance(replies[1], ResponseError)
    assert await connections.execute([("PING",)]) == [b"PONG"]  # the connection is clean


async def test_a_connection_the_server_closed_is_made_again_before_use(
    connections: Connections, redis_server: RedisProcess
) -> None:
    (name,) = await connections.execute([("CLIENT", "SETNAME", "conn-killed")])
    admin = redis_server.client()
    try:
        assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
        await asyncio.sleep(0.05)  # the close reaches the idle connection
        # No command fails for it: the check before use reconnects.
        assert await connections.execute([("PING",)]) == [b"PONG"]
    finally:
        admin.close()
    assert name == b"OK"


async def test_a_call_cut_half_way_does_not_leave_its_reply_to_the_next(
    connections: Connections,
) -> None:
    # The deadline passes while the reply is awaited (BLPOP holds it back).
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await connections.execute([("BLPOP", "conn:empty", 0.3), ("ECHO", "late")])
    for _ in range(3):  # whichever connection comes next answers its own command
        assert await connections.execute([("ECHO", "mine")]) == [b"mine"]


async def test_callers_beyond_the_size_wait_for_a_connection(connections: Connections) -> None:
    # Size 2: three concurrent slow calls take at least two sleeps' time.
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.gather(*(connections.execute([("BLPOP", "conn:empty", 0.1)]) for _ in range(3)))
    assert loop.time() - started >= 0.2
