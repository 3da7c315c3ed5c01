"""The request path's shared, pipelined connections (gateway/store/connections.py), on a
real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from gateway.store.connections import LINKS, Connections
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


async def test_connections_the_server_closed_are_made_again_before_use(
    connections: Connections, redis_server: RedisProcess
) -> None:
    for n in range(LINKS):  # every connection open
        assert await connections.execute([("ECHO", str(n))]) == [str(n).encode()]
    admin = redis_server.client()
    try:
        assert admin.client_kill_filter(_type="normal", skipme=True) >= LINKS
    finally:
        admin.close()
    await asyncio.sleep(0.05)  # the closes reach the idle connections' readers
    # No command fails for them (a Redis restart costs no degraded turn): each
    # connection is made again when next used.
    for _ in range(2 * LINKS):
        assert await connections.execute([("PING",)]) == [b"PONG"]


async def test_a_caller_that_gives_up_leaves_the_next_callers_their_own_replies(
    connections: Connections,
) -> None:
    # The deadline passes while the replies are awaited (BLPOP holds them back).
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await connections.execute([("BLPOP", "conn:empty", 0.3), ("ECHO", "late")])
    # Every connection in turn, the one still owing the late replies included.
    for n in range(2 * LINKS):
        assert await connections.execute([("ECHO", f"mine {n}")]) == [f"mine {n}".encode()]


async def test_concurrent_callers_share_connections_and_get_their_own_replies(
    connections: Connections,
) -> None:
    async def call(n: int) -> list[object]:
        return await connections.execute([("ECHO", f"a{n}"), ("ECHO", f"b{n}")])

    replies = await asyncio.gather(*(call(n) for n in range(500)))
    assert replies == [[f"a{n}".encode(), f"b{n}".encode()] for n in range(500)]


async def test_a_server_that_cannot_be_reached_fails_the_call_and_the_next_one_connects(
    redis_server: RedisProcess,
) -> None:
    client = create_client("redis://127.0.0.1:1/0", timeout_s=2, max_connections=2)
    unreachable = Connections(client.connection_pool)
    with pytest.raises((OSError, RedisConnectionError)):
        await unreachable.execute([("PING",)])
    await unreachable.aclose()
    await client.aclose()
