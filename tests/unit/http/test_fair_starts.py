"""Request starts paced per client address, on a real event loop."""

from __future__ import annotations

import asyncio
import functools

import pytest

from devsupport.servers import ServerThread
from gateway.http.fair_starts import STARTS_PER_TURN, FairStarts, Start
from gateway.http.server import BoundedHeadProtocol, ClientLimits
from tests.unit.http.test_held_addresses import answer_to, refusing_app


async def turns(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_a_few_requests_at_once_start_at_once() -> None:
    starts = FairStarts(asyncio.get_running_loop())
    started: list[int] = []
    for n in range(STARTS_PER_TURN):
        starts.start("a", functools.partial(started.append, n))
    assert started == list(range(STARTS_PER_TURN))


async def test_a_burst_is_spread_over_turns_in_order_while_other_addresses_start_at_once() -> None:
    starts = FairStarts(asyncio.get_running_loop())
    started: list[str] = []
    burst = 5 * STARTS_PER_TURN
    for n in range(burst):
        starts.start("attacker", functools.partial(started.append, f"attacker {n}"))
    assert len(started) == STARTS_PER_TURN
    starts.start("victim", lambda: started.append("victim"))
    assert started[-1] == "victim"  # not behind the burst
    await turns(1)
    assert len(started) == 2 * STARTS_PER_TURN + 1
    await turns(burst)
    assert [s for s in started if s != "victim"] == [f"attacker {n}" for n in range(burst)]
    assert not starts.waiting


async def test_a_queued_address_does_not_jump_its_own_queue() -> None:
    starts = FairStarts(asyncio.get_running_loop())
    started: list[int] = []
    for n in range(3 * STARTS_PER_TURN):
        starts.start("a", functools.partial(started.append, n))
    await turns(1)  # a new turn: the address still has starts waiting, then one more comes
    assert len(started) == 2 * STARTS_PER_TURN
    starts.start("a", lambda: started.append(99))
    assert len(started) == 2 * STARTS_PER_TURN
    await turns(2)
    assert started == [*range(3 * STARTS_PER_TURN), 99]


@pytest.mark.parametrize(("trusted", "paced"), [((), True), (("127.0.0.0/8",), False)])
def test_a_trusted_proxys_requests_start_at_once(
    monkeypatch: pytest.MonkeyPatch, trusted: tuple[str, ...], paced: bool
) -> None:
    """A trusted proxy's connections carry every client behind it: paced as one address,
    they would all start 4 a turn (the server on a real socket, uvicorn in a thread)."""
    through: list[str] = []
    real = FairStarts.start

    def start(self: FairStarts, address: str, begin: Start) -> None:
        through.append(address)
        real(self, address, begin)

    monkeypatch.setattr(FairStarts, "start", start)
    protocol = functools.partial(
        BoundedHeadProtocol,
        limits=ClientLimits(max_connections_per_client=8, trusted_proxies=trusted),
    )
    with ServerThread(refusing_app, http=protocol) as server:
        assert answer_to(server).startswith(b"HTTP/1.1 200")
    assert through == (["127.0.0.1"] if paced else [])
