"""Many requests on one session at once: every turn stored once, whole, in order.

Each test fires N simultaneous requests (N = 2, 10, 50) at one gateway over real sockets
and then reads the log straight from Redis; each runs on one Redis and on a Redis
Cluster. The fake upstream answers ``ack: <text>``, so
an answer names the question it belongs to and a split turn is visible.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import httpx
import pytest

from devsupport.invariants import (
    numbering_problems,
    once_problems,
    pairing_problems,
    version_problems,
)
from devsupport.servers import RedisProcess, ServerThread
from devsupport.stored import stored_log
from gateway.memory.jobs import Job
from gateway.memory.model import Message, Tiers
from gateway.presets import PRESETS
from gateway.service.worker import JobRunner
from gateway.store.keys import SessionKeys
from gateway.store.redis_store import RedisStore, TailMoved
from gateway.summarize.summarizer import Summarizer
from gateway.text.tokens import TokenCounter
from tests.support.clients import Memory, send
from tests.support.concurrency import all_at_once
from tests.support.fixtures import GatewayFactory, on_one_redis_and_a_cluster

# (What these tests prove is how turns are stored, not how fast: the test gateways' roomy
# Redis deadline, ``fixtures.REDIS_DEADLINE_MS``, keeps a burst of 50 on the memory path.)

redis_server = on_one_redis_and_a_cluster()


def assert_sound(
    redis_server: RedisProcess, gateway: ServerThread, key: str, session: str, acked: list[str]
) -> list[dict[str, Any]]:
    log = stored_log(redis_server, key, session)
    state = Memory(gateway, key, session).state()
    problems = pairing_problems(log) + once_problems(log, acked)
    problems += numbering_problems(len(log), state)
    assert not problems, problems
    return log


@pytest.mark.parametrize("n", [2, 10, 50])
def test_simultaneous_new_messages_are_each_stored_once_and_whole(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str, n: int
) -> None:
    tag = uuid.uuid4().hex[:6]
    with httpx.Client(base_url=gateway.url, timeout=30) as http:

        def turn(i: int) -> httpx.Response:
            text = f"note {i} of {tag}"
            return send(http, api_key, session_id, [{"role": "user", "content": text}],
                        stream=i % 2 == 1)  # fmt: skip

        responses = all_at_once(n, turn)
    assert [r.status_code for r in responses] == [200] * n
    assert {r.headers["x-memory-status"] for r in responses} == {"ok"}
    log = assert_sound(
        redis_server, gateway, api_key, session_id, [f"note {i} of {tag}" for i in range(n)]
    )
    assert len(log) == 2 * n


@pytest.mark.parametrize("n", [2, 10, 50])
def test_simultaneous_full_history_clients_import_the_history_once(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str, n: int
) -> None:
    # A conversation the gateway never saw, resent by N requests at once (an app put in
    # front of the gateway mid-conversation, or one that retries while waiting): each
    # plans to import it, one does, the others find the tail moved and plan again.
    history = []
    for i in range(3):
        history += [
            {"role": "user", "content": f"earlier {i}"},
            {"role": "assistant", "content": f"ack: earlier {i}"},
        ]
    with httpx.Client(base_url=gateway.url, timeout=30) as http:

        def turn(i: int) -> httpx.Response:
            return send(http, api_key, session_id,
                        [*history, {"role": "user", "content": f"now {i}"}])  # fmt: skip

        responses = all_at_once(n, turn)
    assert {r.headers["x-memory-status"] for r in responses} == {"ok"}
    acked = [f"earlier {i}" for i in range(3)] + [f"now {i}" for i in range(n)]
    log = assert_sound(redis_server, gateway, api_key, session_id, acked)
    assert [m["content"] for m in log[:6]] == [m["content"] for m in history]
    assert len(log) == 6 + 2 * n


def test_a_regenerate_racing_a_new_turn_never_leaves_an_answer_without_its_question(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        for round_ in range(5):
            say = [{"role": "user", "content": f"question {round_}"}]
            assert send(http, api_key, session_id, say).status_code == 200
            # The whole history without the last answer (a regenerate), while another
            # request adds a turn: the regenerate must not delete or orphan anything.
            log = stored_log(redis_server, api_key, session_id)
            regenerate = [{"role": m["role"], "content": m["content"]} for m in log[:-1]]
            other = [{"role": "user", "content": f"interleaved {round_}"}]

            def turn(i: int, regenerate: Any = regenerate, other: Any = other) -> int:
                return send(http, api_key, session_id, regenerate if i == 0 else other).status_code

            assert all_at_once(2, turn) == [200, 200]
    log = stored_log(redis_server, api_key, session_id)
    assert not pairing_problems(log), pairing_problems(log)
    users = [m["content"] for m in log if m["role"] == "user"]
    for round_ in range(5):
        assert users.count(f"interleaved {round_}") == 1
        assert 1 <= users.count(f"question {round_}") <= 2  # replaced, or a new turn


def test_summary_versions_never_go_back_under_concurrent_turns_and_flushes(
    make_gateway: GatewayFactory, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    # rolling-summary folds every turn: each turn enqueues a job that rewrites the one
    # summary, while flushes and the in-process worker race to run them.
    gateway = make_gateway(memory={"preset": "rolling-summary"})
    memory = Memory(gateway, api_key, session_id)
    memory.add(2)  # the session exists before the race: flushes find it
    versions: list[int] = []
    done = threading.Event()

    def watch() -> None:
        with httpx.Client(base_url=gateway.url, timeout=30) as http:
            while not done.is_set():
                state = http.get(memory.base, headers={"Authorization": f"Bearer {api_key}"})
                rolling = state.json()["rolling_summary"]
                if rolling:
                    versions.append(rolling["version"])

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with httpx.Client(base_url=gateway.url, timeout=30) as http:
            for batch in range(3):

                def turn(i: int, batch: int = batch) -> int:
                    if i % 4 == 3:
                        return http.post(
                            f"/memory/sessions/{session_id}/flush",
                            headers={"Authorization": f"Bearer {api_key}"},
                        ).status_code
                    text = f"batch {batch} item {i}: my colour{i} is shade{batch}"
                    return send(http, api_key, session_id,
                                [{"role": "user", "content": text}]).status_code  # fmt: skip

                assert set(all_at_once(10, turn)) == {200}
        memory.flush()
    finally:
        done.set()
        watcher.join(10)
    final = memory.state()["rolling_summary"]
    versions.append(final["version"])
    assert not version_problems(versions), version_problems(versions)
    assert len(set(versions)) > 1  # the watcher saw the summary evolve


async def test_a_late_duplicate_job_never_overwrites_a_newer_summary(
    store: RedisStore,
) -> None:
    keys = SessionKeys("tenant-late-job", uuid.uuid4().hex)
    messages = [Message("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(30)]
    await store.sessions.record(keys, messages, now=1.0, user_id=None)
    early, late = Job("chunk", 1, 15, 15), Job("chunk", 16, 30, 30)
    await store.queue.enqueue(keys, [early, late])
    runner = JobRunner(store, Summarizer(None, TokenCounter()), PRESETS["hybrid"])
    assert await runner.run(keys, early) == "written"
    assert await runner.run(keys, late) == "written"
    _, newest, _ = await store.sessions.job_state(keys)

    # The early job delivered again (at-least-once) and a write made against the version
    # it read back then: neither may replace what the newer job wrote.
    await store.queue.enqueue(keys, [early])
    assert await runner.run(keys, early) in ("noop", "done")
    stale = Tiers(version=1, summaries=newest.summaries[:1])
    assert await store.sessions.write_tiers(keys, 1, stale, early) == 0
    _, after, _ = await store.sessions.job_state(keys)
    assert after == newest
    assert after.version == newest.version >= 2
    await store.sessions.erase_session(keys)


async def test_record_refuses_a_plan_made_against_a_log_that_moved(
    store: RedisStore,
) -> None:
    keys = SessionKeys("tenant-tail", uuid.uuid4().hex)
    await store.sessions.record(keys, [Message("user", "a"), Message("assistant", "b")],
                       now=1.0, user_id=None)  # fmt: skip
    with pytest.raises(TailMoved):
        await store.sessions.record(keys, [Message("assistant", "c")], now=2.0, user_id=None,
                           expected_count=1)  # fmt: skip
    raw = await store.client.lrange(keys.log, 0, -1)
    assert [json.loads(r)["content"] for r in raw] == ["a", "b"]  # nothing written
    await store.sessions.erase_session(keys)
