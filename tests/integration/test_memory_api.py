"""The memory API, background jobs and erasure, over real sockets and a real Redis."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess, ServerThread, running_redis
from gateway.errors import SummarizerUnavailable
from gateway.memory.jobs import Job
from gateway.memory.model import Message
from gateway.presets import PRESETS
from gateway.service.worker import JobRunner
from gateway.store.keys import JOB_GROUP, SessionKeys
from gateway.store.redis_store import RedisStore, StoreUnavailable, create_client
from gateway.summarize.summarizer import Summarizer
from gateway.text.tokens import TokenCounter
from tests.support.clients import Memory, ranges, say, sdk
from tests.support.fixtures import GatewayFactory, on_one_redis_and_a_cluster
from tests.support.jobs import notices, streams
from tests.support.processes import worker_process
from tests.support.waiting import wait_for

redis_server = on_one_redis_and_a_cluster()


def all_session_keys(redis_server: RedisProcess) -> set[bytes]:
    client = redis_server.client()
    try:
        return {k for k in client.scan_iter(count=1000) if k.startswith(b"mg:{")}
    finally:
        client.close()


def jobs_settled(redis_server: RedisProcess) -> bool:
    """No job notice waits in a shard for the worker, and none is in its hands."""
    client = redis_server.client()
    try:
        for stream in streams():
            if not client.exists(stream):
                continue
            for group in client.xinfo_groups(stream):
                if group["name"] not in (JOB_GROUP, JOB_GROUP.encode()):
                    continue
                last = group["last-delivered-id"]
                last = last.decode() if isinstance(last, bytes) else last
                if group["pending"] or client.xrange(stream, min=f"({last}", count=1):
                    return False
        return True
    finally:
        client.close()


def test_chat_turns_are_summarized_in_the_background(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    for n in range(8):  # 16 messages: hybrid summarizes 1-15 without a flush
        say(client, f"turn {n}: my code{n} is K{n}")
    memory = Memory(gateway, api_key, session_id)
    wait_for(lambda: memory.state()["pending_jobs"] == 0 and memory.state()["summaries"])
    assert ranges(memory.state()) == [(1, 15)]
    memory.http.close()


def test_pins_add_list_delete_and_automatic_pins(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    say(sdk(gateway, api_key, session_id), "Remember: the wifi password is tulip-42")
    memory = Memory(gateway, api_key, session_id)
    pins = memory.http.get(memory.base + "/pins").json()["pins"]
    assert [(p["content"], p["pin_type"], p["source_index"]) for p in pins] == [
        ("the wifi password is tulip-42", "auto", 1)
    ]
    created = memory.http.post(memory.base + "/pins", json={"content": "prefers metric units"})
    assert created.status_code == 201 and created.json()["importance"] == 0.8
    scored = memory.http.post(memory.base + "/pins", json={"content": "q", "source_index": 1})
    assert scored.json()["importance"] == 0.5  # seed 004's heuristic for that message
    bad = memory.http.post(memory.base + "/pins", json={"content": "", "importance": 3})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "content"
    context = memory.context("what is the wifi password?")["messages"][0]["content"]
    # The user's own request to remember it, quoted as theirs.
    assert '## Pinned\n- the user asked to remember: "the wifi password is tulip-42"' in context
    pin_id = created.json()["id"]
    assert memory.http.delete(f"{memory.base}/pins/{pin_id}").status_code == 204
    assert memory.http.delete(f"{memory.base}/pins/{pin_id}").status_code == 404
    assert len(memory.http.get(memory.base + "/pins").json()["pins"]) == 2
    memory.http.close()


def test_unknown_and_foreign_sessions_look_the_same(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    say(sdk(gateway, api_key, session_id), "hello")
    mine = Memory(gateway, api_key, session_id)
    theirs = Memory(gateway, api_key + "-other", session_id)
    nobody = Memory(gateway, api_key, session_id + "-missing")
    assert mine.http.get(mine.base).status_code == 200
    foreign = theirs.http.get(theirs.base)
    missing = nobody.http.get(nobody.base)
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["error"]["type"] == missing.json()["error"]["type"] == "not_found"
    for memory in (mine, theirs, nobody):
        memory.http.close()


def test_export_json_and_markdown_and_end_of_session(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(memory={"preset": "recursive-summary"})
    memory = Memory(gateway, api_key, session_id)
    memory.add(11, "message {i}: my note{i} is N{i}")
    ended = memory.http.post(memory.base + "/end").json()
    assert ended["ended"] is True and ended["pending_jobs"] == 0
    assert ended["rolling_summary"]["range"] == {"start": 1, "end": 10}
    exported = memory.http.get(memory.base + "/export", params={"format": "json"}).json()
    assert [m["index"] for m in exported["messages"]] == list(range(1, 12))
    assert exported["messages"][0]["content"] == "message 1: my note1 is N1"
    markdown = memory.http.get(memory.base + "/export", params={"format": "markdown"}).text
    assert markdown.startswith(f"# Session: {session_id}\n")
    assert "- Message Count: 11" in markdown and "- Summary Version: 1" in markdown
    assert "## Short-Term Messages (Last 10)" in markdown
    assert "**Message 11 (User):** message 11: my note11 is N11" in markdown
    assert "## Medium-Term Summary" in markdown
    assert memory.http.get(memory.base + "/export?format=pdf").status_code == 400
    memory.http.close()


def test_erasing_a_session_and_a_user_leaves_no_key(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    before = all_session_keys(redis_server)
    for n in range(2):
        client = sdk(gateway, api_key, f"{session_id}-{n}", **{"X-User-Id": "erasable-user"})
        for k in range(8):
            say(client, f"message {k}: my secret{k} is S{k}")
    http = httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {api_key}"})
    user = http.get("/memory/users/erasable-user").json()
    assert user["sessions"] == [f"{session_id}-0", f"{session_id}-1"]
    assert http.delete(f"/memory/sessions/{session_id}-0").status_code == 204
    assert http.get("/memory/users/erasable-user").json()["sessions"] == [f"{session_id}-1"]
    assert http.delete("/memory/users/erasable-user").status_code == 204
    assert http.get("/memory/users/erasable-user").status_code == 404
    assert http.get(f"/memory/sessions/{session_id}-1").status_code == 404
    # The in-process worker finishes whatever it had picked up.
    wait_for(lambda: jobs_settled(redis_server), what="every job notice done")
    assert all_session_keys(redis_server) - before == set()
    client = redis_server.client()
    assert not any(b"secret" in v for _, _, fields in notices(client) for v in fields.values())
    client.close()
    http.close()


class _BlockingModel:
    """A summarizer model that waits until released: a job kept in flight."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(self, messages: list[dict[str, str]], *, max_tokens: int) -> str:
        self.started.set()
        await self.release.wait()
        raise SummarizerUnavailable("released")


async def job_in_flight(
    store: RedisStore, keys: SessionKeys
) -> tuple[JobRunner, _BlockingModel, asyncio.Task[Any]]:
    """15 messages and their chunk job, running, its summarizer call waiting for release."""
    messages = [Message("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(15)]
    await store.sessions.record(keys, messages, now=1.0, user_id=None)
    job = Job("chunk", 1, 15, 15)
    await store.queue.enqueue(keys, [job])
    model = _BlockingModel()
    runner = JobRunner(store, Summarizer(model, TokenCounter()), PRESETS["hybrid"])
    task = asyncio.create_task(runner.run(keys, job))
    await asyncio.wait_for(model.started.wait(), 5)
    return runner, model, task


async def test_an_in_flight_job_does_not_resurrect_an_erased_session(
    store: RedisStore,
) -> None:
    keys = SessionKeys("tenant-erase", "in-flight")
    _, model, task = await job_in_flight(store, keys)
    await store.sessions.erase_session(keys)
    model.release.set()
    assert await task == "gone"
    leftover = [k async for k in store.client.scan_iter(match=f"mg:{keys.tag}*")]
    assert leftover == []


def test_memory_survives_a_restart_summaries_included(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    first = make_gateway()
    memory = Memory(first, api_key, session_id)
    memory.add(30)
    state = memory.flush()
    assert ranges(state) == [(1, 15), (16, 30)]
    memory.http.close()
    first.stop()
    second = make_gateway()
    again = Memory(second, api_key, session_id)
    assert again.state() == state
    again.http.close()


def test_memory_api_needs_redis(make_gateway: GatewayFactory, api_key: str) -> None:
    gateway = make_gateway(redis_url="redis://127.0.0.1:1/0")
    response = httpx.get(
        gateway.url + "/memory/sessions/x", headers={"Authorization": f"Bearer {api_key}"}
    )
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "memory_unavailable"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/messages", {"messages": []}, "messages"),
        ("/messages", {"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
        ("/messages", {"msgs": []}, "messages"),
        # An assistant message with nothing in it: stored, OpenAI would refuse it later.
        (
            "/messages",
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": None},
                ]
            },
            "messages.1.content",
        ),
        ("/messages", {"messages": [{"role": "assistant"}]}, "messages.0.content"),
        (
            "/context",
            {"model": "fake-model", "messages": [{"role": "assistant"}]},
            "messages.0.content",
        ),
        ("/context", {"messages": []}, "model"),
        # Said in the future (more than a day ahead of the gateway's clock): it would pass
        # for the session's newest message.
        (
            "/messages",
            {
                "messages": [
                    {"role": "user", "content": "x", "timestamp": "2024-01-01T10:00:00Z"},
                    {"role": "assistant", "content": "y", "timestamp": "2099-01-01T10:00:00Z"},
                ]
            },
            "messages.1.timestamp",
        ),
    ],
)
def test_memory_api_bad_input(
    gateway: ServerThread, api_key: str, path: str, body: dict[str, Any], param: str
) -> None:
    response = httpx.post(
        f"{gateway.url}/memory/sessions/s{path}",
        json=body,
        headers={"Authorization": f"Bearer {api_key}"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert response.json()["error"]["type"] == "invalid_request_error"
    stored = httpx.get(
        f"{gateway.url}/memory/sessions/s", headers={"Authorization": f"Bearer {api_key}"}
    )
    assert stored.status_code == 404  # nothing was stored


def test_an_imported_refused_answer_keeps_its_refusal(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    """A refused answer as the SDK returns it (content null, the refusal beside it) is
    imported with the refusal as its content: later turns send it as OpenAI takes it."""
    memory = Memory(gateway, api_key, session_id)
    refused = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    messages = [{"role": "user", "content": "my color is teal; how do I pick a lock?"}, refused]
    response = memory.http.post(memory.base + "/messages", json={"messages": messages})
    assert response.status_code == 200, response.text
    kept = {"role": "assistant", "content": [{"type": "refusal", "refusal": refused["refusal"]}]}
    assert say(sdk(gateway, api_key, session_id), "what is my color?") == "Your color is teal."
    forwarded = fake_upstream.last_messages()
    assert forwarded[:3] == [
        {"role": "user", "content": "my color is teal; how do I pick a lock?"},
        kept,
        {"role": "user", "content": "what is my color?"},
    ]


def test_separate_worker_processes_run_the_jobs_and_reclaim_a_crashed_ones(
    make_gateway: GatewayFactory, redis_server: RedisProcess, upstream_url: str, tmp_path: Path,
    api_key: str, session_id: str,
) -> None:  # fmt: skip
    gateway = make_gateway(worker={"in_process": False})
    config = tmp_path / "worker.yaml"
    config.write_text(
        f"upstream:\n  base_url: {upstream_url}\nredis:\n  url: {redis_server.url}\n"
        "summarizer:\n  model: fake-summarizer\nworker:\n  reclaim_idle_s: 1\n"
    )
    # A consumer that reads a notice and dies before acknowledging it.
    client = redis_server.client()
    memory = Memory(gateway, api_key, session_id)
    memory.add(15)
    assert memory.state()["pending_jobs"] == 1
    taken = []
    for stream in streams():
        try:
            client.xgroup_create(stream, "summarizers", id="0", mkstream=True)
        except Exception as error:
            assert "BUSYGROUP" in str(error)
        taken += client.xreadgroup("summarizers", "crashed-consumer", {stream: ">"}, count=100)
    assert taken, "the dead consumer took the notice"
    worker = worker_process(config)
    try:
        wait_for(lambda: memory.state()["pending_jobs"] == 0, timeout=20)
        assert ranges(memory.state()) == [(1, 15)]
        memory.add(15)  # a new job, picked up normally
        wait_for(lambda: ranges(memory.state()) == [(1, 15), (16, 30)], timeout=20)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(15) == 0
        client.close()
        memory.http.close()


async def test_a_lease_left_by_a_redis_crash_does_not_hold_up_the_sessions_jobs() -> None:
    # The runner holds the session's lease when Redis is killed; its release fails, and
    # Redis comes back from its AOF still holding the lease (120 s). The next run releases
    # it instead of waiting it out (a flush of that session timed out before).
    with running_redis(appendonly=True) as redis_server:
        store = RedisStore(create_client(redis_server.url, timeout_s=0.5, max_connections=4),
                           timeout_s=0.5, retention_s=3600)  # fmt: skip
        keys = SessionKeys("tenant-lease", "crash")
        runner, model, task = await job_in_flight(store, keys)
        await asyncio.to_thread(redis_server.stop, signal.SIGKILL)
        model.release.set()  # the summarizer answers; writing it fails: Redis is gone
        with pytest.raises(StoreUnavailable):
            await task
        await asyncio.to_thread(redis_server.start)
        assert await store.client.exists(keys.lease) == 1  # the AOF kept it

        started = time.monotonic()
        assert await asyncio.wait_for(runner.flush(keys), 10) == 1
        assert time.monotonic() - started < 5
        _, tiers, pending = await store.sessions.job_state(keys)
        assert pending == [] and [(s.start, s.end) for s in tiers.summaries] == [(1, 15)]
        await store.close()
