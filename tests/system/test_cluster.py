"""The gateway on a real Redis Cluster: two gateway processes and two worker processes
share nothing but a local 3-master cluster (``devsupport/cluster.py``).

The same properties as on one Redis: a conversation is remembered and summarized
whichever replica serves each turn; simultaneous turns on one session through both
replicas are each stored once, whole, in order; summary versions never go back; tenants
never meet; a crashed worker's jobs are taken over; job notices spread over the masters.
The last test kills a master under load and reports what its failover cost.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from devsupport.cluster import RedisCluster
from devsupport.fake_upstream import FakeUpstream
from devsupport.invariants import (
    numbering_problems,
    once_problems,
    pairing_problems,
    version_problems,
)
from devsupport.servers import ServerThread
from devsupport.stored import log_of
from gateway.auth.identity import tenant_id
from gateway.store.keys import TENANT_SECRET_KEY, SessionKeys, job_shard, job_stream
from tests.support.clients import Memory, sdk, send
from tests.support.concurrency import all_at_once
from tests.support.jobs import SHARDS, streams
from tests.support.metrics import scrape, value
from tests.support.processes import Served, worker_process
from tests.support.waiting import reached, wait_for


@dataclass
class Deployment:
    cluster: RedisCluster
    gateways: list[Served]
    workers: list[Any]  # subprocess.Popen
    config: Path
    clients: list[Any] = field(default_factory=list)
    stuck: list[Any] = field(default_factory=list)

    def client(self) -> Any:
        """A cluster client for reading what the gateways stored."""
        client = self.cluster.client()
        self.clients.append(client)
        return client

    def start_workers(self, n: int) -> None:
        """``n`` more worker processes, once each has begun reading every shard."""
        logs = []
        for _ in range(n):
            logs.append(self.config.parent / f"worker-{len(self.workers)}.log")
            self.workers.append(worker_process(self.config, logs[-1]))
        client = self.client()
        # (A consumer appears in XINFO only once it was handed a notice: not a sign.)
        wait_for(
            lambda: (
                all("consuming jobs" in log.read_text() for log in logs)
                and all(client.exists(stream) for stream in streams())
            ),
            60,
            "the workers",
        )
        # Their reads are under way: every live worker blocked in XREADGROUP on every shard.
        live = sum(1 for worker in self.workers if worker.poll() is None)
        wait_for(lambda: self.blocked_reads() >= SHARDS * live, 60, "the workers' reads")

    def blocked_reads(self) -> int:
        """Clients the masters hold blocked in XREADGROUP (the workers' reads of the shards)."""
        blocked = 0
        for _, port in self.cluster.masters():
            with contextlib.closing(self.cluster.node_client(port)) as node:
                blocked += sum(
                    1 for c in node.client_list() if c["cmd"] == "xreadgroup" and "b" in c["flags"]
                )
        return blocked

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        for gateway in self.gateways:
            if gateway.process.poll() is None:
                gateway.stop()
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:  # said below, after the processes are gone
                worker.kill()
                worker.wait(10)
                self.stuck.append(worker.args)
        assert not self.stuck, f"workers that ignored SIGTERM for 20 s: {self.stuck}"


def deploy(
    cluster: RedisCluster, upstream_url: str, work: Path, *, gateways: int = 2, workers: int = 2,
    **settings: Any,
) -> Deployment:  # fmt: skip
    """``gateways`` serve processes and ``workers`` worker processes on ``cluster``."""
    seed = cluster.url.split("://", 1)[1]
    config = work / "gateway.yaml"
    document: dict[str, Any] = {
        "upstream": {"base_url": upstream_url},
        # Generous: a 2-core machine runs the cluster, four processes and the tests.
        "redis": {"url": f"redis+cluster://{seed}", "timeout_ms": 3000},
        "memory": {"preset": "hybrid"},
        "summarizer": {"model": "fake-summarizer"},
        "worker": {"in_process": False, "reclaim_idle_s": 1},
    }
    for section, values in settings.items():
        document[section] = {**document.get(section, {}), **values}
    config.write_text(yaml.safe_dump(document))
    deployment = Deployment(cluster, [], [], config)
    try:
        for _ in range(gateways):
            deployment.gateways.append(Served(config, None))
        deployment.start_workers(workers)
    except BaseException:
        deployment.stop()
        raise
    return deployment


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as running:
        yield running


@pytest.fixture(scope="module")
def deployment(
    cluster: RedisCluster,
    fake_upstream_server: tuple[FakeUpstream, ServerThread],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployment]:
    _, upstream = fake_upstream_server
    running = deploy(cluster, upstream.url + "/v1", tmp_path_factory.mktemp("cluster"))
    yield running
    running.stop()


def sdk_on(gateway: Served, key: str, session: str) -> openai.OpenAI:
    """The SDK on a gateway process (closed after the test, as ``sdk``'s clients are)."""
    return sdk(gateway, key, session)  # type: ignore[arg-type]


def assert_sound(log: list[dict[str, Any]], state: dict[str, Any], acked: list[str]) -> None:
    problems = pairing_problems(log) + once_problems(log, acked)
    problems += numbering_problems(len(log), state)
    assert not problems, problems


def test_a_conversation_across_both_replicas_is_remembered_and_summarized_by_the_workers(
    deployment: Deployment, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    first, second = deployment.gateways
    clients = [sdk_on(first, api_key, session_id), sdk_on(second, api_key, session_id)]
    said = []
    for turn in range(24):
        text = "turn 0: my pet is rex" if turn == 0 else f"chat {turn}"
        said.append(text)
        answer = clients[turn % 2].chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": text}]
        )
        assert answer.headers["x-memory-status"] == "ok"
        assert answer.parse().choices[0].message.content == f"ack: {text}"
        if turn:
            # The replica that did not record the previous turn still forwards it: no
            # process keeps memory of its own that another replica's write would stale.
            forwarded = str(fake_upstream.last_messages())
            assert said[turn - 1] in forwarded
    # The workers (not the gateways: in_process is off) summarize what fell due.
    memory = Memory(second, api_key, session_id)  # type: ignore[arg-type]
    wait_for(lambda: memory.state()["pending_jobs"] == 0, 30, "the workers to run the jobs")
    state = memory.state()
    assert state["summaries"], state
    assert_sound(log_of(deployment.client(), api_key, session_id), state, said)
    answer = clients[1].chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "what is my pet?"}]
    )
    assert "rex" in (answer.choices[0].message.content or "")  # said 24 turns ago


@pytest.mark.parametrize("n", [2, 20])
def test_simultaneous_turns_through_both_replicas_are_each_stored_once_and_whole(
    deployment: Deployment, api_key: str, session_id: str, n: int
) -> None:
    tag = uuid.uuid4().hex[:6]
    https = [httpx.Client(base_url=g.url, timeout=30) for g in deployment.gateways]
    try:

        def turn(i: int) -> httpx.Response:
            text = f"note {i} of {tag}"
            return send(https[i % 2], api_key, session_id, [{"role": "user", "content": text}],
                        stream=i % 4 >= 2)  # fmt: skip

        responses = all_at_once(n, turn)
    finally:
        for http in https:
            http.close()
    assert [r.status_code for r in responses] == [200] * n
    assert {r.headers["x-memory-status"] for r in responses} == {"ok"}
    log = log_of(deployment.client(), api_key, session_id)
    state = Memory(deployment.gateways[0], api_key, session_id).state()  # type: ignore[arg-type]
    assert_sound(log, state, [f"note {i} of {tag}" for i in range(n)])
    assert len(log) == 2 * n


def test_summary_versions_never_go_back_when_replicas_and_workers_race(
    deployment: Deployment, api_key: str, session_id: str
) -> None:
    """Turns through both replicas make jobs that two workers and flushes through both
    replicas race to run: the tiers' version, read all along, only ever goes up."""
    memories = [Memory(g, api_key, session_id) for g in deployment.gateways]  # type: ignore[arg-type]
    memories[0].add(10)
    versions: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            versions.append(memories[len(versions) % 2].state()["tiers_version"])

    watcher = threading.Thread(target=watch)
    watcher.start()
    https = [httpx.Client(base_url=g.url, timeout=30) for g in deployment.gateways]
    try:
        for batch in range(3):

            def turn(i: int, batch: int = batch) -> int:
                http = https[i % 2]
                if i % 5 == 4:
                    return http.post(
                        f"/memory/sessions/{session_id}/flush",
                        headers={"Authorization": f"Bearer {api_key}"},
                    ).status_code
                text = f"batch {batch} item {i}: " + "words to summarize " * 20
                return send(http, api_key, session_id,
                            [{"role": "user", "content": text}]).status_code  # fmt: skip

            assert set(all_at_once(10, turn)) == {200}
        memories[1].flush()
    finally:
        done.set()
        watcher.join(10)
        for http in https:
            http.close()
    versions.append(memories[0].state()["tiers_version"])
    assert not version_problems(versions), version_problems(versions)
    assert len(set(versions)) > 1  # the summaries did change while they were watched


def test_tenants_never_meet_on_the_cluster(deployment: Deployment, session_id: str) -> None:
    keys = [f"sk-tenant-{uuid.uuid4().hex}" for _ in range(2)]
    for n, key in enumerate(keys):
        client = sdk_on(deployment.gateways[n], key, session_id)
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": f"my secret is s{n}x"}]
        )
    for n, key in enumerate(keys):
        for gateway in deployment.gateways:
            memory = Memory(gateway, key, session_id)  # type: ignore[arg-type]
            seen = str(memory.state()) + str(memory.context("what is my secret?"))
            assert f"s{n}x" in seen and f"s{1 - n}x" not in seen


def test_job_notices_spread_over_the_masters_and_crashed_workers_jobs_are_taken_over(
    deployment: Deployment, api_key: str
) -> None:
    client = deployment.client()
    # Sessions whose notices go to different shards, on different masters.
    tenant = tenant_id(client.get(TENANT_SECRET_KEY), api_key)
    masters_of_shard = {s: deployment.cluster.master_of(job_stream(s)) for s in range(SHARDS)}
    assert len(set(masters_of_shard.values())) > 1, masters_of_shard
    sessions: dict[int, str] = {}
    while len(sessions) < SHARDS:
        session = f"spread-{uuid.uuid4().hex[:8]}"
        sessions.setdefault(job_shard(SessionKeys(tenant, session), SHARDS), session)
    # Both workers stop; the notices of new jobs are handed to their waiting reads (pending
    # on them, never acknowledged); then both die. Two new workers must take them over.
    for worker in deployment.workers:
        worker.send_signal(signal.SIGSTOP)
    memories = {s: Memory(deployment.gateways[s % 2], api_key, session)  # type: ignore[arg-type]
                for s, session in sessions.items()}  # fmt: skip
    for memory in memories.values():
        memory.add(16)  # past hybrid's first chunk: one job each

    # Redis hands the notices to the stopped workers' blocked reads.
    def pending() -> dict[str, int]:
        return {s: client.xpending(s, "summarizers")["pending"] for s in streams()}

    wait_for(lambda: sum(pending().values()) >= 1, 10, "notices held by the stopped workers")
    held = pending()
    # /metrics reads the backlog of every shard from its master, lag included (its first
    # read: nothing cached). Redis's clock is this machine's.
    read_from = time.time()
    samples = scrape(deployment.gateways[1].url)
    read_by = time.time()
    assert value(samples, "memory_gateway_jobs_backlog_up") == 1
    for shard, stream in enumerate(streams()):
        shown = value(samples, "memory_gateway_jobs_pending", state="delivered", shard=str(shard))
        assert shown == held[stream]
        if held[stream]:  # the age of the oldest notice when the backlog was read
            ((oldest, _),) = client.xrange(stream, count=1)
            enqueued = int(oldest.split(b"-")[0]) / 1000
            lag = value(samples, "memory_gateway_jobs_lag_seconds", shard=str(shard))
            assert read_from - enqueued - 0.01 <= lag <= read_by - enqueued + 0.01
    for worker in deployment.workers:
        worker.kill()
        worker.wait(10)
    assert sum(held.values()) >= 1, held  # the dead workers did hold jobs
    deployment.start_workers(2)
    for memory in memories.values():
        wait_for(lambda m=memory: m.state()["pending_jobs"] == 0, 30, "the reclaimed jobs")
        assert [s["range"] for s in memory.state()["summaries"]][:1] == [{"start": 1, "end": 15}]
    for stream in streams():  # acknowledged by the workers that took them over
        assert client.xpending(stream, "summarizers")["pending"] == 0


# --- a master lost ---------------------------------------------------------------------


@dataclass
class FailoverReport:
    acknowledged: int  # turns answered 200 with memory "ok"
    lost: int  # of those, not in the log after the failover
    degraded: int  # answered without memory: sessions on the lost master's slots
    degraded_elsewhere: int  # the same, of sessions on the other masters
    failover_s: float  # kill to the replica serving the slots (as the cluster reports)
    recovered_s: float  # kill to the first turn on those slots recorded again
    problems: list[str]

    def summary(self) -> str:
        return (
            f"failover: {self.acknowledged} acknowledged turns, {self.lost} lost, "
            f"{self.degraded} degraded on the lost master's sessions and "
            f"{self.degraded_elsewhere} on the others; the replica took over after "
            f"{self.failover_s:.2f} s, "
            f"turns on the lost master's slots recorded again after {self.recovered_s:.2f} s"
        )


@pytest.mark.parametrize("full_coverage", ["yes", "no"])
def test_a_master_killed_under_load_fails_over_and_memory_resumes(
    fake_upstream_server: tuple[FakeUpstream, ServerThread],
    tmp_path: Path,
    api_key: str,
    full_coverage: str,
) -> None:
    """``cluster-require-full-coverage yes`` (Redis's default): every master refuses
    commands (CLUSTERDOWN) from the moment the lost master is declared failed until its
    replica takes over, so every session degrades for that moment. ``no``: only the lost
    master's sessions do."""
    _, upstream = fake_upstream_server
    settings = ("--cluster-require-full-coverage", full_coverage)
    with RedisCluster(settings=settings) as cluster:
        running = deploy(cluster, upstream.url + "/v1", tmp_path, redis={"timeout_ms": 500})
        try:
            report = _kill_a_master_under_load(running, api_key)
        finally:
            running.stop()
    print(report.summary())
    assert not report.problems, report.problems
    assert report.acknowledged > 20
    if full_coverage == "no":
        assert report.degraded_elsewhere == 0, report.summary()  # the other masters served on
    assert report.recovered_s < 30, report.summary()
    # Replication is asynchronous: only turns acknowledged in the last moment before the
    # kill (not yet copied to the replica) may be lost.
    assert report.lost <= 4, report.summary()


def _kill_a_master_under_load(running: Deployment, key: str) -> FailoverReport:
    client = running.client()
    sessions = [f"failover-{n}-{uuid.uuid4().hex[:6]}" for n in range(6)]
    for session in sessions:  # the tenant secret and every session exist before the kill
        sdk_on(running.gateways[0], key, session).chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hello"}]
        )
    tenant = tenant_id(client.get(TENANT_SECRET_KEY), key)
    victim = running.cluster.master_of(SessionKeys(tenant, sessions[0]).log)
    on_victim = {s for s in sessions if running.cluster.master_of(
        SessionKeys(tenant, s).log) == victim}  # fmt: skip
    acknowledged: dict[str, list[str]] = {s: [] for s in sessions}
    degraded = {True: 0, False: 0}  # by whether the session is on the lost master
    stop = threading.Event()
    killed_at: list[float] = []
    recovered_at: list[float] = []
    lock = threading.Lock()

    def converse(n: int, session: str) -> None:
        client = sdk_on(running.gateways[n % 2], key, session).with_options(timeout=10)
        turn = 0
        while not stop.is_set():
            turn += 1
            text = f"{session} turn {turn}"
            started = time.monotonic()
            try:
                answer = client.chat.completions.with_raw_response.create(
                    model="fake-model", messages=[{"role": "user", "content": text}]
                )
            except openai.APIError:
                continue
            with lock:
                if answer.headers.get("x-memory-status") == "ok":
                    acknowledged[session].append(text)
                    after_kill = killed_at and started > killed_at[0]
                    if after_kill and session in on_victim and not recovered_at:
                        recovered_at.append(time.monotonic())
                else:
                    degraded[session in on_victim] += 1
            time.sleep(0.02)

    threads = [threading.Thread(target=converse, args=pair) for pair in enumerate(sessions)]
    for thread in threads:
        thread.start()
    # Under load: every session has had turns acknowledged.
    wait_for(lambda: all(len(acknowledged[s]) >= 3 for s in sessions), 30, "turns under load")
    running.cluster.kill_master(victim[1])  # SIGKILL: gone when this returns
    killed_at.append(time.monotonic())
    failover_s = running.cluster.wait_for_failover(victim[1])
    reached(lambda: recovered_at, timeout=30)  # the report says whether it was
    # Turns after the recovery, on every session.
    since = {s: len(acknowledged[s]) for s in sessions}
    reached(lambda: all(len(acknowledged[s]) >= since[s] + 3 for s in sessions), timeout=10)
    stop.set()
    for thread in threads:
        thread.join(30)
    fresh = running.client()  # the slot map as it is now
    lost, problems = 0, []
    for session in sessions:
        log = log_of(fresh, key, session)[2:]  # after the "hello" turn
        stored = {m["content"] for m in log if m["role"] == "user"}
        lost += sum(1 for text in acknowledged[session] if text not in stored)
        problems += pairing_problems(log)
        problems += [p for p in once_problems(log, []) if "stored" in p]
    return FailoverReport(
        acknowledged=sum(len(texts) for texts in acknowledged.values()),
        lost=lost,
        degraded=degraded[True],
        degraded_elsewhere=degraded[False],
        failover_s=failover_s,
        recovered_s=(recovered_at[0] - killed_at[0]) if recovered_at else float("inf"),
        problems=problems,
    )


def _move_slot(cluster: RedisCluster, key: str, to_port: int) -> None:
    """Reshards ``key``'s slot, keys and all, to the master on ``to_port`` (as
    ``redis-cli --cluster reshard`` does it)."""
    slot = cluster.keyslot(key)
    source_port = cluster.master_of(key)[1]
    ids = {node.port: node.node_id for node in cluster.topology()}
    source, target = cluster.node_client(source_port), cluster.node_client(to_port)
    try:
        target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source_port])
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to_port])
        while keys := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            source.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
        for _, port in cluster.masters():
            with cluster.node_client(port) as client:
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[to_port])
    finally:
        source.close()
        target.close()


def test_a_session_whose_slot_moved_is_followed_to_its_new_master(
    deployment: Deployment, api_key: str, session_id: str
) -> None:
    """The gateways learnt the slot map at start; a reshard moves a session's slot. Its
    next turns meet ``MOVED``: followed, on both replicas, with nothing lost."""
    client = sdk_on(deployment.gateways[0], api_key, session_id)
    client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "before the move"}]
    )
    reader = deployment.client()
    keys = SessionKeys(tenant_id(reader.get(TENANT_SECRET_KEY), api_key), session_id)
    owner = deployment.cluster.master_of(keys.log)
    target = next(address for address in deployment.cluster.masters() if address != owner)
    _move_slot(deployment.cluster, keys.log, target[1])
    assert deployment.cluster.master_of(keys.log) == target
    said = ["before the move"]
    for turn in range(4):
        text = f"after the move {turn}"
        said.append(text)
        answer = sdk_on(deployment.gateways[turn % 2], api_key, session_id)
        response = answer.chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": text}]
        )
        assert response.headers["x-memory-status"] == "ok"
    log = log_of(deployment.client(), api_key, session_id)
    state = Memory(deployment.gateways[1], api_key, session_id).state()  # type: ignore[arg-type]
    assert_sound(log, state, said)
    assert len(log) == 2 * len(said)
