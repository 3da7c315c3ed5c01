"""The request path's shared, pipelined connections (gateway/store/connections.py), on a
real Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from devsupport.servers import RedisProcess
from gateway.store.connections import LINKS, Connections
from gateway.store.redis_store import create_client
from tests.support.waiting import until


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
    # The closes reach the idle connections' protocols, which mark them failed.
    await until(
        lambda: all(link.failed is not None for link in connections._links),
        5,
        "the server's closes seen",
    )
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


# --- the deadline: how long Redis may stay silent, not how long a call waits ---------------

# Holds Redis for ARGV[1] microseconds, then answers: a busy Redis, not a lost one.
BUSY = """
local start = redis.call('TIME')
repeat
  local now = redis.call('TIME')
until (now[1] - start[1]) * 1000000 + (now[2] - start[2]) >= tonumber(ARGV[1])
return 1
"""
# Redis reads a client's commands 16 KiB at a time and sends the replies of what it read
# before reading on. Padded past that, each busy call is read, run and answered on its own,
# as the commands of a burst of requests are.
PADDING = "x" * 20_000


def busy(microseconds: int) -> tuple[object, ...]:
    return ("EVAL", BUSY, 0, microseconds, PADDING)


@pytest.fixture
async def one_link(redis_server: RedisProcess) -> AsyncIterator[Connections]:
    """A single connection: every call queues behind the ones written before it."""
    client = create_client(redis_server.url, timeout_s=2, max_connections=2)
    opened = Connections(client.connection_pool, links=1, max_queued_s=0.3)
    yield opened
    await opened.aclose()
    await client.aclose()


async def test_a_call_queued_behind_calls_redis_keeps_answering_waits_past_its_deadline(
    redis_server: RedisProcess,
) -> None:
    # 10 ms of work each, 800 ms in all: an answer every 10 ms, twenty to each of the
    # call's 200 ms deadlines, under a cap (max_queued_s) it never reaches. With a 50 ms
    # deadline and the fixture's 0.3 s cap, one answer 53 ms late on a loaded machine
    # ended the wait; a deadline 20 answers long leaves room for a descheduled Redis.
    client = create_client(redis_server.url, timeout_s=2, max_connections=2)
    link = Connections(client.connection_pool, links=1, max_queued_s=5)
    try:
        ahead = [asyncio.ensure_future(link.execute([busy(10_000)])) for _ in range(80)]
        await asyncio.sleep(0)  # written first
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await link.execute([("PING",)], timeout_s=0.2) == [b"PONG"]
        assert loop.time() - start >= 0.6  # three times its deadline, answered all along
        assert await asyncio.gather(*ahead) == [[1]] * 80
    finally:
        await link.aclose()
        await client.aclose()


async def test_a_call_on_a_silent_redis_times_out_at_its_deadline(one_link: Connections) -> None:
    blocked = asyncio.ensure_future(one_link.execute([("BLPOP", "conn:never", 0.5)]))
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        await one_link.execute([("PING",)], timeout_s=0.05)
    assert 0.05 <= loop.time() - start < 0.3  # not extended: nothing came from Redis
    assert await blocked == [None]  # the connection still reads what it owes
    assert await one_link.execute([("PING",)], timeout_s=0.5) == [b"PONG"]  # a new one


async def test_waiting_behind_a_busy_redis_is_capped(one_link: Connections) -> None:
    # 10 ms of work each, 1 s in all: an answer every 10 ms, twenty to each of the call's
    # 200 ms deadlines. (With 50 ms deadlines, Redis descheduled for 60 ms on a loaded CI
    # machine ended the wait at 0.12 s, as the deadline says it should: not the cap's
    # test.)
    ahead = [asyncio.ensure_future(one_link.execute([busy(10_000)])) for _ in range(100)]
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        await one_link.execute([("PING",)], timeout_s=0.2)
    # Its deadline and max_queued_s (0.2 + 0.3 s), though Redis kept answering (1 s of
    # work ahead of it). The lower bound is the cap alone: how much of the deadline had
    # run when the wait began is the loop's business.
    assert 0.3 <= loop.time() - start < 0.95
    await asyncio.gather(*ahead)


async def test_a_reply_that_came_while_the_loop_was_busy_is_taken(one_link: Connections) -> None:
    await one_link.execute([("PING",)])  # open
    call = asyncio.ensure_future(one_link.execute([("PING",)], timeout_s=0.05))
    await asyncio.sleep(0)  # the call queued for this loop turn's write
    await asyncio.sleep(0)  # written, its deadline set
    assert not one_link._links[0].unsent
    time.sleep(0.2)  # noqa: ASYNC251 (on purpose: other requests' work holds the loop)
    assert await call == [b"PONG"]  # Redis answered at once; the loop was late, not Redis


async def test_the_calls_of_one_loop_turn_go_out_in_one_write(one_link: Connections) -> None:
    await one_link.execute([("PING",)])  # open
    (link,) = one_link._links
    real = link.transport
    writes: list[bytes] = []

    class Counting:
        def write(self, data: bytes) -> None:
            writes.append(data)
            real.write(data)

        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

    link.transport = Counting()  # type: ignore[assignment]
    replies = await asyncio.gather(
        *(one_link.execute([("ECHO", f"e{n}")], timeout_s=1) for n in range(50))
    )
    assert replies == [[f"e{n}".encode()] for n in range(50)]
    assert len(writes) == 1  # a write per call was ~3.5% of the gateway's CPU
    assert await one_link.execute([("PING",)]) == [b"PONG"]  # a later turn: a write of its own
    assert len(writes) == 2
