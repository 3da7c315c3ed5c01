"""Redis round trips on the request path: at most two per turn (issue 6), every preset.

A round trip is one write of commands to a Redis connection followed by reading their
replies: one command, one pipeline or one script call. The gateway's store gets a link
that counts them (and notes which store operation sent each: ``tests.support.round_trips``),
over a real redis-server; the turn measured is a steady-state one that does all it can do:
recall finds archived messages outside the window (and, with X-User-Id, in the user's
ended session), and the turn's messages make a summarization job due.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess
from gateway.auth.identity import Identity, MemoryMode
from gateway.config import MemoryConfig
from gateway.memory.jobs import schedule
from gateway.memory.model import Message
from gateway.presets import PRESETS
from gateway.service.memory_service import MemoryService
from gateway.service.turn import session_keys
from gateway.store.redis_store import RedisStore
from gateway.text.tokens import TokenCounter
from tests.support.clients import Memory, import_all, register_content, say, sdk
from tests.support.clock import SteppedClock
from tests.support.jobs import notices, notices_withdrawn

MAX_ROUND_TRIPS = 2
PLANTED = "My booking reference is QX-48213, keep it."
QUESTION = "What was my booking reference QX-48213 about?"
EARLIER = "My dog is called Rexford and he loves the beach."


@pytest.fixture(autouse=True)
def _withdraw_notices(redis_server: RedisProcess) -> Iterator[None]:
    with notices_withdrawn(redis_server.client):
        yield


def _history(length: int, planted: dict[int, str]) -> list[dict[str, str]]:
    messages = []
    for index in range(1, length + 1):
        role = "user" if index % 2 else "assistant"
        text = planted.get(
            index, f"Message {index} about the weekly planning of topic {index % 5}."
        )
        messages.append({"role": role, "content": register_content(text)})
    return messages


def _length_before_a_due_job(preset: str, at_least: int, below: int) -> int:
    """A stored length (even) at which the next turn's two messages make a job due."""
    composition = PRESETS[preset]
    for length in range(at_least, below, 2):
        roles = ["user" if i % 2 else "assistant" for i in range(1, length + 3)]
        history = [Message(role, "text", index=i) for i, role in enumerate(roles, start=1)]
        if schedule(composition, history, count_before=length, turns_before=length // 2):
            return length
    raise AssertionError(f"{preset}: no job falls due between {at_least} and {below}")


def _notices(redis_server: RedisProcess, session: str) -> set[bytes]:
    """The job ids the stream announces for a session."""
    client = redis_server.client()
    try:
        entries = list(notices(client))
    finally:
        client.close()
    return {fields[b"job"] for _, _, fields in entries if fields[b"sid"] == session.encode()}


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("with_user", [False, True], ids=["anonymous", "x-user-id"])
def test_a_steady_state_turn_takes_at_most_two_round_trips(
    counted_gateway: Any,
    redis_server: RedisProcess,
    fake_upstream: FakeUpstream,
    api_key: str,
    session_id: str,
    preset: str,
    with_user: bool,
) -> None:
    make, trips = counted_gateway
    gateway = make(preset)
    user = {"X-User-Id": f"user-{session_id}"} if with_user else {}
    recalls = PRESETS[preset].recall is not None
    crosses = with_user and PRESETS[preset].cross_session is not None
    if crosses:
        # The user's earlier session, ended: its profile and archive are searched too.
        earlier = Memory(gateway, api_key, session_id + "-earlier")
        import_all(earlier, _history(30, {1: EARLIER}), headers=user)
        assert earlier.http.post(earlier.base + "/end").json()["ended"] is True
    # Past the window; with a user, young enough for the cross-session tier (< 40).
    length = _length_before_a_due_job(preset, 18 if crosses else 30, 120)
    memory = Memory(gateway, api_key, session_id)
    import_all(memory, _history(length - 2, {3: PLANTED}), headers=user)
    client = sdk(gateway, api_key, session_id, **user)
    say(client, "A first turn in the session, to warm the connections.")
    assert memory.flush()["message_count"] == length
    notices_before = _notices(redis_server, session_id)

    trips.calls.clear()
    say(client, QUESTION + (" And my dog Rexford?" if crosses else ""))
    calls = list(trips.calls)

    assert memory.state()["pending_jobs"] > 0, "the turn made a job due"
    assert _notices(redis_server, session_id) - notices_before, "and announced it"
    forwarded = fake_upstream.last_messages()[0]["content"]
    if recalls:
        assert PLANTED in forwarded, "recall found the archived message"
    if crosses:
        assert EARLIER in forwarded, "recall found the earlier session's message"
    assert len(calls) <= MAX_ROUND_TRIPS, calls
    memory.http.close()


def test_the_first_turn_of_a_users_new_session_takes_two_round_trips_ending_none(
    counted_gateway: Any, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    """A new session joins its user's index, and their other sessions are checked for
    idleness, within the record's round trip; the earlier session's archive is searched
    in the load's (the process learnt which sessions the user's history names at the
    user's previous request: the open session's first turn)."""
    make, trips = counted_gateway
    gateway = make("hybrid-recall")
    user = {"X-User-Id": f"user-{session_id}"}
    earlier = Memory(gateway, api_key, session_id + "-earlier")
    import_all(earlier, _history(30, {1: EARLIER}), headers=user)
    assert earlier.http.post(earlier.base + "/end").json()["ended"] is True
    say(sdk(gateway, api_key, session_id + "-open", **user), "A session still open.")
    for name in ("-new", "-newer"):
        client = sdk(gateway, api_key, session_id + name, **user)
        trips.calls.clear()
        say(client, "What is my dog Rexford like?")
        calls = list(trips.calls)
        assert EARLIER in fake_upstream.last_messages()[0]["content"]
        assert len(calls) <= MAX_ROUND_TRIPS, (name, calls)
    users = earlier.http.get(f"/memory/users/user-{session_id}").json()["sessions"]
    assert {session_id + "-new", session_id + "-newer"} <= set(users)
    earlier.http.close()


def test_a_third_round_trip_ends_the_users_idle_sessions(
    counted_gateway: Any, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    make, trips = counted_gateway
    tiers = PRESETS["hybrid-recall"].model_dump(mode="json")
    tiers["cross_session"]["idle_end_s"] = 0.2
    clock = SteppedClock()
    gateway = make("hybrid-recall", clock=clock, tiers=tiers)
    user = {"X-User-Id": f"user-{session_id}"}
    say(sdk(gateway, api_key, session_id, **user), "A session that goes idle.")
    clock.advance(0.5)  # idle past idle_end_s
    trips.calls.clear()
    say(sdk(gateway, api_key, session_id + "-b", **user), "A new session of the same user.")
    assert trips.calls == ["load_turn", "record", "end_sessions"]
    memory = Memory(gateway, api_key, session_id)
    assert memory.state()["pending_jobs"] == 1  # the end of the idle session
    assert _notices(redis_server, session_id) == {b"end:0-0:t0"}
    memory.http.close()


# --- what the second round trip is left for: correctness when a prediction misses ---

IDENTITY = Identity("tenant-rt", "session-rt", None, MemoryMode.ON)


async def test_jobs_of_a_turn_that_lost_the_race_are_enqueued_for_where_it_landed(
    store: RedisStore, redis_server: RedisProcess
) -> None:
    """Two turns planned on the same empty session: the second lands after the first, not
    where it predicted, so its jobs are computed again from its real indexes."""
    identity = replace(IDENTITY, session_id=f"race-{uuid.uuid4().hex[:8]}")
    service = MemoryService(store, TokenCounter(), MemoryConfig(preset="rolling-summary"))
    first = await service.prepare(identity, (Message("user", "first question"),), "gpt-4o")
    second = await service.prepare(identity, (Message("user", "second question"),), "gpt-4o")
    await service.recorder.record(first, Message("assistant", "first answer"), now=1.0)
    await service.recorder.record(second, Message("assistant", "second answer"), now=2.0)

    client = redis_server.client()
    try:
        pending = sorted(client.hkeys(session_keys(identity).jobs))
    finally:
        client.close()
    assert pending == [b"fold:1-2:t1", b"fold:3-4:t2"]
    assert _notices(redis_server, identity.session_id) == set(pending)


async def test_a_server_that_lost_its_scripts_gets_them_again(
    store: RedisStore, redis_server: RedisProcess
) -> None:
    """After a restart (here SCRIPT FLUSH) the load and the record, called by sha in
    pipelines, find their scripts missing, load them and run whole, once."""
    identity = replace(IDENTITY, session_id=f"flush-{uuid.uuid4().hex[:8]}")
    service = MemoryService(store, TokenCounter(), MemoryConfig(preset="rolling-summary"))
    for n in range(2):
        client = redis_server.client()
        client.script_flush()
        client.close()
        turn = await service.prepare(identity, (Message("user", f"question {n}"),), "gpt-4o")
        client = redis_server.client()
        client.script_flush()
        client.close()
        await service.recorder.record(turn, Message("assistant", f"answer {n}"), now=1.0 + n)
    count, messages = await store.sessions.tail(session_keys(identity), 10)
    assert count == 4
    assert [m.text for m in messages] == ["question 0", "answer 0", "question 1", "answer 1"]
    assert _notices(redis_server, identity.session_id) == {b"fold:1-2:t1", b"fold:3-4:t2"}
