"""Sizing: what a number of active sessions needs in Redis memory and CPU, gateway cores
and summarizer calls, computed from measurements taken here.

Measured (every party its own process on free loopback ports, as ``bench/overhead.py``
runs them: ``bench/fast_upstream.py`` as the upstream and, with the model
``bench-summarizer``, as a summarizer whose answers fail validation, so every job takes
the model-free fallback):

1. **bytes per session** against history length: sessions of 10, 100, 1,000 (5,000)
   messages of ``bench/conversations.py`` imported through ``POST
   /memory/sessions/{sid}/messages`` in batches, ``POST …/flush`` after each batch (one
   gateway with its in-process worker, preset ``hybrid-recall``, a private
   redis-server); then ``MEMORY USAGE … SAMPLES 0`` summed over the keys the session
   made (``SCAN mg:{*`` before and after).
2. **summarization jobs per turn** of every preset: ``gateway.memory.jobs.schedule``
   called as ``Recorder.writes`` calls it, for a 1,000-turn conversation (pure).
3. **Redis work per request** on a local 3-master + 3-replica Redis Cluster, one gateway
   (no summarization worker anywhere: the request path only), continuing turns
   (turn 11+), non-streamed, one at a time: commands and round trips per request, the
   commands' time (INFO commandstats ``usec``) and the masters' process CPU.
4. **throughput**, a closed loop of non-streamed memory requests (``bench/load.py``):
   (a) 1 gateway on a private redis-server, concurrency 32; (b) 2 gateways on the
   cluster, a load process of concurrency 16 on each at once. One ``memory-gateway
   worker`` process per deployment. Gateway CPU per request (all its threads).

Then the **sizing table**: for 10^5, 10^6 and 10^7 active sessions, from the
measurements and the assumptions given as options (``size()``).

    .venv/bin/python bench/sizing.py --quick               # ~40 s
    .venv/bin/python bench/sizing.py --json out.json       # ~3 min
    .venv/bin/python bench/sizing.py --messages-per-session 500 --turns-per-session-per-hour 6

Times and CPU are the machine's that runs it (and its neighbours'): read the
assumptions and the sources printed under the tables before the totals.
"""

from __future__ import annotations

import argparse
import bisect
import concurrent.futures
import contextlib
import json
import math
import os
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._harness import cpu_seconds, free_port, ms, quantile, table  # noqa: E402
from bench.conversations import DEFAULT_DEPTHS, generate  # noqa: E402
from bench.flat_cost import Session, flush_session, post  # noqa: E402
from bench.overhead import (  # noqa: E402
    INSTANT_MODEL,
    PYTHON,
    closed_loop,
    count_commands,
    gateway_config,
    process,
    targets,
)
from devsupport.cluster import RedisCluster  # noqa: E402
from devsupport.servers import RedisProcess  # noqa: E402
from gateway.config import MemoryConfig, WorkerConfig  # noqa: E402
from gateway.memory.jobs import schedule  # noqa: E402
from gateway.memory.model import Message  # noqa: E402
from gateway.presets import PRESETS  # noqa: E402
from gateway.store import scripts  # noqa: E402

DEFAULT_PRESET = MemoryConfig().preset  # hybrid-recall
SEED = 11  # of the imported conversations (bench/load.py's requests use seed 6)
IMPORT_BATCH = 100  # messages per import, each followed by a flush
SIM_TURNS = 1000
SIM_TOKENS = 30
SESSIONS = (10**5, 10**6, 10**7)
REDIS_CPU = {  # --redis-cpu: which measure of Redis CPU per request the sizing uses
    "process": "the masters' process CPU per continuing turn at concurrency 1",
    "commandstats": "INFO commandstats usec summed per continuing turn (script bodies twice)",
    "load": "the masters' process CPU per request in throughput (b), the worker's included",
}
GIB = 1024**3
# Sessions per load: few enough that each gets several turns in a run (continuing
# conversations, with their jobs falling due), as a deployment's active sessions do.
LOAD_SESSIONS = 64
IDLE_S = 1.0  # idle CPU measured over this long before a measurement, then subtracted
# The commands the store's Lua scripts run (their time is inside the EVALSHA's as well);
# not the rate limiter's or the admin API's, which a turn does not run.
SCRIPTED = frozenset(
    name.lower()
    for script in scripts.names()
    if script not in ("admit", "change_key")
    for name in re.findall(r"redis\.p?call\(\s*['\"](\w+)['\"]", scripts.source(script))
)


@dataclass(frozen=True)
class Plan:
    lengths: tuple[int, ...]  # history lengths (messages) measured for bytes per session
    sessions_per_length: int
    redis_n: int  # requests counted on the cluster
    seconds: float  # each throughput run


FULL = Plan((10, 100, 1000, 5000), 2, 200, 10.0)
QUICK = Plan((10, 100, 1000), 1, 50, 3.0)


@dataclass(frozen=True)
class Assumptions:
    messages_per_session: int = 200
    turns_per_session_per_hour: float = 30
    node_memory_gib: float = 25  # usable per master
    replicas: int = 1
    redis_cpu_headroom: float = 0.5  # fraction of one core a master (or a gateway) may use


@dataclass(frozen=True)
class Measured:
    """What the sizing needs from the measurements."""

    bytes_per_session: dict[int, float]  # history length (messages) -> bytes
    redis_cpu_s_per_request: float
    gateway_cpu_s_per_request: float
    jobs_per_turn: float


@dataclass(frozen=True)
class Row:
    area: str
    measure: str
    value: str
    detail: str = ""


@dataclass
class Report:
    settings: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    sizing: list[dict[str, float]] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)


# --- the arithmetic (pure) ----------------------------------------------------------------


def interpolate(points: dict[int, float], x: float) -> float:
    """Piecewise-linear through ``points`` (x -> y); past either end, the nearest
    segment's line continued (one point: that value)."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    right = bisect.bisect_left(xs, x, 1, len(xs) - 1)  # the segment ending at xs[right]
    x0, x1 = xs[right - 1], xs[right]
    return points[x0] + (points[x1] - points[x0]) * (x - x0) / (x1 - x0)


def size(sessions: int, measured: Measured, assume: Assumptions) -> dict[str, float]:
    """What ``sessions`` active sessions need, each holding ``messages_per_session``
    messages and taking ``turns_per_session_per_hour`` turns (one request each):

    - Redis data on the masters = sessions * bytes per session (interpolated linearly in
      history length between the measured lengths); with replicas * (1 + replicas);
    - masters by memory = ⌈data / node_memory_gib⌉;
    - request rate = sessions * turns per hour / 3600;
    - masters by CPU = ⌈req/s * Redis CPU s per request / redis_cpu_headroom⌉;
    - masters = the larger, at least 3 (a cluster's minimum); nodes = masters * (1 + replicas);
    - gateway cores = ⌈req/s * gateway CPU s per request / redis_cpu_headroom⌉ (the same
      headroom: a core run at that fraction);
    - summarizer calls/s = req/s * jobs per turn (a job of ``hybrid-recall`` is one call).
    """
    per_session = interpolate(measured.bytes_per_session, assume.messages_per_session)
    data_gib = sessions * per_session / GIB
    rps = sessions * assume.turns_per_session_per_hour / 3600
    by_memory = math.ceil(data_gib / assume.node_memory_gib)
    by_cpu = math.ceil(rps * measured.redis_cpu_s_per_request / assume.redis_cpu_headroom)
    masters = max(3, by_memory, by_cpu)
    return {
        "sessions": sessions,
        "bytes_per_session": per_session,
        "redis_gib": data_gib,
        "redis_gib_with_replicas": data_gib * (1 + assume.replicas),
        "masters_by_memory": by_memory,
        "masters_by_cpu": by_cpu,
        "masters": masters,
        "nodes": masters * (1 + assume.replicas),
        "requests_per_s": rps,
        "gateway_cores": math.ceil(
            rps * measured.gateway_cpu_s_per_request / assume.redis_cpu_headroom
        ),
        "summarizer_calls_per_s": rps * measured.jobs_per_turn,
    }


SIZING_HEADER = (
    "sessions",
    "Redis data (GiB, masters)",
    "with replicas (GiB)",
    "masters by memory",
    "masters by CPU",
    "masters",
    "total nodes",
    "req/s",
    "gateway cores",
    "summarizer calls/s",
)


def sizing_cells(row: dict[str, float]) -> list[str]:
    return [
        f"{row['sessions']:,.0f}",
        f"{row['redis_gib']:,.1f}",
        f"{row['redis_gib_with_replicas']:,.1f}",
        f"{row['masters_by_memory']:,.0f}",
        f"{row['masters_by_cpu']:,.0f}",
        f"{row['masters']:,.0f}",
        f"{row['nodes']:,.0f}",
        f"{row['requests_per_s']:,.0f}",
        f"{row['gateway_cores']:,.0f}",
        f"{row['summarizer_calls_per_s']:,.0f}",
    ]


# --- 2. jobs per turn (pure) --------------------------------------------------------------


def jobs_per_turn(turns: int = SIM_TURNS, tokens: int = SIM_TOKENS) -> dict[str, dict[str, float]]:
    """Jobs per turn of every preset, by kind and in all: ``turns`` turns (a user message
    and its answer, recorded together as a chat request records them), each scheduled
    as ``Recorder.writes`` does: the stored tail (``reconcile_tail`` messages) and
    the two appended messages, with the count and turns before them."""
    tail = MemoryConfig().reconcile_tail
    out: dict[str, dict[str, float]] = {}
    for name, composition in PRESETS.items():
        stored: list[Message] = []
        kinds: Counter[str] = Counter()
        for turn in range(turns):
            before = len(stored)
            appended = (
                Message("user", f"question {turn}", index=before + 1, tokens=tokens),
                Message("assistant", f"answer {turn}", index=before + 2, tokens=tokens),
            )
            history = (*stored[-tail:], *appended)
            jobs = schedule(composition, history, count_before=before, turns_before=turn)
            kinds.update(job.kind for job in jobs)
            stored += appended
        out[name] = {kind: n / turns for kind, n in sorted(kinds.items())}
        out[name]["total"] = sum(kinds.values()) / turns
    return out


def jobs_rows(report: Report) -> None:
    jobs = jobs_per_turn()
    report.raw["jobs_per_turn"] = jobs
    for name, kinds in jobs.items():
        detail = ", ".join(f"{k} {v:.3f}" for k, v in kinds.items() if k != "total")
        marker = " (default)" if name == DEFAULT_PRESET else ""
        report.rows.append(
            Row("jobs", f"{name}{marker}: jobs / turn", f"{kinds['total']:.3f}", detail)
        )
    report.sources.append(
        f"jobs: gateway.memory.jobs.schedule over a {SIM_TURNS:,}-turn conversation (a user "
        f"message and its answer per turn, ~{SIM_TOKENS} tokens each), called as "
        "Recorder.writes calls it; pure, no server. Summarizer calls per job: 1 for "
        "hybrid-recall's chunk and facts; 2 for fold/compress (summary + key pair) and for "
        "progressive's chunk (summary + facts, merges aside); 1-2 for recursive."
    )


# --- 1. bytes per session -----------------------------------------------------------------


def _kind(key: bytes) -> str:
    return key.decode().rsplit(":", 1)[-1]


def session_sizes(report: Report, http: httpx.Client, store: redis.Redis, plan: Plan) -> None:
    run = uuid.uuid4().hex[:6]
    raw: dict[str, Any] = {}
    for length in plan.lengths:
        sizes, parts = [], Counter[str]()
        for number in range(plan.sessions_per_length):
            made = generate(SEED, number, max(length, 100), DEFAULT_DEPTHS).messages[:length]
            sid = f"size-{run}-{length}-{number}"
            keys_before = set(store.scan_iter(match="mg:{*", count=1000))
            for start in range(0, length, IMPORT_BATCH):
                batch = list(made[start : start + IMPORT_BATCH])
                post(http, f"/memory/sessions/{sid}/messages", {"messages": batch})
                flush_session(http, Session(sid, (), ()))
            keys = set(store.scan_iter(match="mg:{*", count=1000)) - keys_before
            usage = {key: store.memory_usage(key, samples=0) or 0 for key in keys}
            sizes.append(sum(usage.values()))
            parts.update({_kind(k): v for k, v in usage.items()})
        mean = statistics.mean(sizes)
        raw[str(length)] = {"bytes": sizes, "by_key": dict(parts)}
        shares = ", ".join(
            f"{kind} {v / sum(parts.values()):.0%}" for kind, v in parts.most_common()
        )
        report.rows.append(
            Row(
                "bytes",
                f"session of {length:,} messages",
                f"{mean / 1024:,.1f} KiB ({mean / length:,.0f} B/message)",
                shares,
            )
        )
    report.raw["bytes"] = raw
    report.sources.append(
        f"bytes: MEMORY USAGE … SAMPLES 0 summed over the keys a session made (SCAN mg:{{* "
        f"before/after); {plan.sessions_per_length} session(s) per length of "
        f"bench/conversations.py text (seed {SEED}) imported in batches of {IMPORT_BATCH} "
        f"with a flush after each; preset {DEFAULT_PRESET}, in-process worker, model-free "
        "fallback summaries; a private redis-server (a cluster node adds a few bytes per key)."
    )


# --- 3. Redis work per request on the cluster ---------------------------------------------


def _cpu(pids: Sequence[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


def cluster_work(
    report: Report,
    http: httpx.Client,
    masters: list[redis.Redis],
    master_pids: list[int],
    plan: Plan,
) -> dict[str, float]:
    """Counted on a gateway with no summarization worker anywhere: the request path only."""
    texts = [m["content"] for m in generate(SEED, 99, 600, DEFAULT_DEPTHS).messages]
    texts = texts[::2]  # the user's side
    counter = iter(range(10**9))
    run = uuid.uuid4().hex[:6]
    warm = [f"c-{run}-{i}" for i in range(10)]
    degraded = Counter[str]()

    def chat(session: str) -> None:
        body = {
            "model": INSTANT_MODEL,
            "messages": [{"role": "user", "content": texts[next(counter) % len(texts)]}],
        }
        response = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": session})
        response.raise_for_status()
        degraded[response.headers.get("x-memory-status", "")] += 1

    for client in masters:
        client.config_resetstat()
    for _ in range(10):  # ten sessions of ten turns: continuing conversations
        for session in warm:
            chat(session)
    degraded.clear()

    def measured(send: Callable[[], None], n: int) -> dict[str, Any]:
        cpu, started = _cpu(master_pids), time.monotonic()
        counted = count_commands(masters, send, n)
        counted["cpu_s"] = _cpu(master_pids) - cpu
        counted["elapsed_s"] = time.monotonic() - started
        return counted

    idle = measured(lambda: time.sleep(IDLE_S), 1)
    turns = measured(lambda: chat(warm[next(counter) % len(warm)]), plan.redis_n)
    idle_rate = idle["cpu_s"] / idle["elapsed_s"]
    process_cpu = max(turns["cpu_s"] - idle_rate * turns["elapsed_s"], 0.0) / plan.redis_n
    direct = sum(v for k, v in turns["usec_commands"].items() if k not in SCRIPTED)
    report.raw["cluster_redis"] = {
        "idle": idle,
        "continuing": turns,
        "memory_status": dict(degraded),
        "scripted": sorted(SCRIPTED),
    }
    commands = ", ".join(f"{k} {v:g}" for k, v in turns["commands"].items())
    area = "redis (cluster)"
    report.rows += [
        Row(
            area,
            "continuing turn: round trips / request",
            f"{turns['round_trips']:.2f}",
            f"{degraded['degraded']} of {plan.redis_n} degraded (memory lost: fewer commands)",
        ),
        Row(area, "continuing turn: commands / request", commands, "script bodies included"),
        Row(
            area,
            "Redis CPU / request: commandstats usec summed",
            f"{turns['usec']:,.0f} µs",
            "a script's usec includes its body's commands, counted again by name",
        ),
        Row(
            area,
            "Redis CPU / request: commandstats usec, script bodies once",
            f"{direct:,.0f} µs",
            "the calls the gateway sent ("
            + ", ".join(
                f"{k} {v:,.0f}" for k, v in turns["usec_commands"].items() if k not in SCRIPTED
            )
            + " µs); no I/O",
        ),
        Row(
            area,
            "Redis CPU / request: masters' process CPU",
            f"{process_cpu * 1e6:,.0f} µs",
            f"I/O and replication included; idle {idle_rate * 1000:.1f} ms/s (3 masters) "
            "subtracted",
        ),
    ]
    report.sources.append(
        f"redis (cluster): {plan.redis_n} continuing non-streamed turns (10 sessions past "
        "turn 10) at concurrency 1 through one gateway on 3 masters + 3 replicas, no "
        "summarization worker; CONFIG RESETSTAT on every master first, then INFO stats "
        "commandstats before/after summed over the masters (bench/overhead.py "
        "count_commands: round trips = read events, a call split over two masters counts "
        "2; replicas' REPLCONF ACKs left out); process CPU = the masters' threads' on-CPU "
        "time (/proc/PID/task/*/schedstat) minus their idle rate measured over 1 s; script "
        "bodies once = commandstats usec of the commands other than those the gateway's Lua "
        "scripts run (gateway/store/scripts/*.lua; a command sent both ways would be "
        "left out)."
    )
    return {"commandstats": turns["usec"] * 1e-6, "process": process_cpu}


# --- 4. throughput ------------------------------------------------------------------------


def load_runs(
    specs: list[dict[str, Any]],
    concurrency: int,
    seconds: float,
    pids: dict[str, list[int]],
) -> dict[str, Any]:
    """One load process per target, all at once. CPU of every named group of processes
    over the run, minus what they spend idle (measured over ``IDLE_S`` just before)."""

    def cpu() -> dict[str, list[float]]:
        return {name: [cpu_seconds(pid) for pid in group] for name, group in pids.items()}

    def grown(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, Any]:
        return {
            name: [b - a for a, b in zip(before[name], after[name], strict=True)] for name in pids
        }

    idle_from = cpu()
    time.sleep(IDLE_S)
    before, started = cpu(), time.monotonic()
    idle = {name: [c / IDLE_S for c in v] for name, v in grown(idle_from, before).items()}
    with concurrent.futures.ThreadPoolExecutor(len(specs)) as pool:
        futures = [
            pool.submit(
                closed_loop,
                spec,
                INSTANT_MODEL,
                concurrency,
                seconds,
                False,
                keep_totals=True,
                sessions=LOAD_SESSIONS,
            )
            for spec in specs
        ]
        runs = [future.result() for future in futures]
    elapsed = time.monotonic() - started
    busy = {
        name: [max(c - rate * elapsed, 0.0) for c, rate in zip(v, idle[name], strict=True)]
        for name, v in grown(before, cpu()).items()
    }
    totals = [t for r in runs for t in r.pop("totals")]
    errors: Counter[str] = sum((Counter(r["errors"]) for r in runs), Counter())
    requests = [r["requests"] for r in runs]
    return {
        "runs": runs,
        "rps": sum(r["rps"] for r in runs),
        "p50_s": quantile(totals, 0.5),
        "p99_s": quantile(totals, 0.99),
        "requests": sum(requests),
        "errors": dict(errors),
        "degraded": sum(r["memory"].get("degraded", 0) for r in runs),
        "elapsed_s": elapsed,
        "idle_cpu_per_s": idle,
        "cpu_s": busy,
        # Gateway i served load i's requests only.
        "gateway_cpu_per_request": [
            c / max(n, 1) for c, n in zip(busy["gateways"], requests, strict=True)
        ],
        "worker_cpu_per_request": sum(busy["worker"]) / max(sum(requests), 1),
        "redis_cpu_per_request": sum(busy["redis"]) / max(sum(requests), 1),
    }


def throughput_rows(report: Report, a: dict[str, Any], b: dict[str, Any]) -> None:
    def fmt_cpu(s: float) -> str:
        return f"{s * 1e6:,.0f} µs ({1 / s:,.0f} req/s per core)" if s > 0 else "-"

    for area, label, result in (
        ("throughput (a)", "1 gateway, 1 Redis, c=32", a),
        ("throughput (b)", "2 gateways, cluster, c=2x16", b),
    ):
        loads = len(result["runs"])
        turns = result["requests"] / (loads * LOAD_SESSIONS)
        problems = f"{sum(result['errors'].values())} errors, {result['degraded']} degraded"
        report.rows += [
            Row(area, f"{label}: req/s", f"{result['rps']:,.0f}", problems),
            Row(area, "p50 / p99", f"{ms(result['p50_s'], 1)} / {ms(result['p99_s'], 1)}"),
            Row(
                area,
                "gateway CPU / request",
                " + ".join(fmt_cpu(s) for s in result["gateway_cpu_per_request"]),
                "each gateway's own" if loads > 1 else "",
            ),
            Row(
                area,
                "turns per session in the run",
                f"{turns:.1f}",
                f"{loads} x {LOAD_SESSIONS:,} sessions, continuing",
            ),
            Row(
                area,
                "worker CPU / request (during the run)",
                f"{result['worker_cpu_per_request'] * 1e6:,.0f} µs",
                "jobs done in the run only, model-free fallback summaries",
            ),
            Row(
                area,
                "Redis CPU / request (process, worker's work included)",
                f"{result['redis_cpu_per_request'] * 1e6:,.0f} µs",
                "the masters'" if loads > 1 else "",
            ),
        ]
    ratio = b["rps"] / a["rps"] if a["rps"] else math.nan
    report.rows.append(
        Row("throughput", "b / a", f"{ratio:.2f}x", f"{os.cpu_count()} cores for every process")
    )


# --- the run ------------------------------------------------------------------------------


def _serve(config: Path, port: int, log: Path) -> contextlib.AbstractContextManager[Any]:
    args = [PYTHON, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)]
    return process(args, f"http://127.0.0.1:{port}/healthz", log)


def _worker(config: Path, log: Path) -> contextlib.AbstractContextManager[Any]:
    return process([PYTHON, "-m", "gateway.cli", "worker", "--config", str(config)], None, log)


@contextlib.contextmanager
def _http(port: int, key: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
    ) as client:
        yield client


def run(plan: Plan, assume: Assumptions, work: Path, redis_cpu: str) -> Report:
    key = "sk-bench-" + secrets.token_urlsafe(16)
    report = Report(
        {
            "plan": asdict(plan),
            "assumptions": asdict(assume),
            "redis_cpu_measure": redis_cpu,
            "preset": DEFAULT_PRESET,
            "job_shards": WorkerConfig().job_shards,
            "cpus": os.cpu_count(),
        }
    )
    concurrency = 32
    phases: dict[str, float] = report.settings.setdefault("phase_s", {})
    clock = [time.monotonic()]

    def lap(name: str) -> None:
        now = time.monotonic()
        phases[name] = round(now - clock[0], 1)
        clock[0] = now

    with contextlib.ExitStack() as stack:
        up_port = free_port()
        upstream = f"http://127.0.0.1:{up_port}/v1"
        up_args = [PYTHON, str(ROOT / "bench" / "fast_upstream.py"), "--port", str(up_port)]
        stack.enter_context(process(up_args, upstream + "/models", work / "upstream.log"))

        # 2. Pure.
        jobs_rows(report)
        lap("start, jobs")

        # 1. Bytes per session: one gateway with its in-process worker, a private Redis.
        with contextlib.ExitStack() as phase:
            server = RedisProcess().start()
            phase.callback(server.cleanup)
            config = gateway_config(work / "bytes.yaml", upstream, server.url, worker=True)
            port = free_port()
            phase.enter_context(_serve(config, port, work / "bytes-gateway.log"))
            http = phase.enter_context(_http(port, key))
            store = phase.enter_context(contextlib.closing(server.client()))
            session_sizes(report, http, store, plan)
        lap("bytes")

        # 4a. Throughput: 1 gateway + 1 worker on a private Redis.
        with contextlib.ExitStack() as phase:
            server = RedisProcess().start()
            phase.callback(server.cleanup)
            config = gateway_config(work / "single.yaml", upstream, server.url, worker=False)
            worker = phase.enter_context(_worker(config, work / "single-worker.log"))
            port = free_port()
            gateway = phase.enter_context(_serve(config, port, work / "single-gateway.log"))
            spec = targets({"gateway": f"http://127.0.0.1:{port}/v1", "direct": ""}, key)
            assert server.process is not None
            single = load_runs(
                [spec["memory"]],
                concurrency,
                plan.seconds,
                {"gateways": [gateway.pid], "worker": [worker.pid], "redis": [server.process.pid]},
            )
        lap("throughput a")

        cluster = stack.enter_context(RedisCluster())
        seed = cluster.url.replace("redis://", "redis+cluster://", 1)
        masters = cluster.masters()
        master_pids = []
        for _, master_port in masters:
            node = cluster.node(master_port)
            assert node.process is not None
            master_pids.append(node.process.pid)
        lap("cluster start")

        # 3. Redis work per request: the request path alone (no worker anywhere).
        with contextlib.ExitStack() as phase:
            config = gateway_config(work / "counted.yaml", upstream, seed, worker=False)
            port = free_port()
            phase.enter_context(_serve(config, port, work / "counted-gateway.log"))
            http = phase.enter_context(_http(port, key))
            clients = [
                phase.enter_context(contextlib.closing(cluster.node_client(p))) for _, p in masters
            ]
            redis_cpu_s = cluster_work(report, http, clients, master_pids, plan)
        lap("redis on the cluster")

        # 4b. Throughput: 2 gateways + 1 worker on the cluster, a load on each at once.
        with contextlib.ExitStack() as phase:
            config = gateway_config(work / "cluster.yaml", upstream, seed, worker=False)
            worker = phase.enter_context(_worker(config, work / "cluster-worker.log"))
            gateways, specs = [], []
            for i in range(2):
                port = free_port()
                gateways.append(
                    phase.enter_context(_serve(config, port, work / f"cluster-gateway-{i}.log"))
                )
                url = f"http://127.0.0.1:{port}/v1"
                specs.append(targets({"gateway": url, "direct": ""}, key)["memory"])
            pair = load_runs(
                specs,
                concurrency // 2,
                plan.seconds,
                {
                    "gateways": [g.pid for g in gateways],
                    "worker": [worker.pid],
                    "redis": master_pids,
                },
            )
        lap("throughput b")
    lap("stop")
    report.raw["throughput"] = {"a": single, "b": pair}
    redis_cpu_s["load"] = pair["redis_cpu_per_request"]
    throughput_rows(report, single, pair)
    report.sources.append(
        f"throughput: bench/load.py closed loop, non-streaming, model {INSTANT_MODEL} (instant "
        f"upstream), one new user message per request over {LOAD_SESSIONS} sessions per load "
        f"(X-Session-Id), {plan.seconds:g} s after 5 warm-up requests; (a) concurrency "
        f"{concurrency} on 1 gateway, (b) {concurrency // 2} on each of 2 gateways at once, "
        "req/s summed, p50/p99 over both; worker.in_process false and one `memory-gateway "
        "worker` per deployment; CPU = on-CPU time of every thread of the process "
        "(/proc/PID/task/*/schedstat) over the run, minus its idle rate measured over 1 s "
        "before, / the requests it served (see turns per session for their age). Every process "
        "(Redis nodes, gateways, worker, upstream, load generators) shares the machine."
    )

    measured = Measured(
        bytes_per_session={
            int(length): statistics.mean(v["bytes"]) for length, v in report.raw["bytes"].items()
        },
        redis_cpu_s_per_request=redis_cpu_s[redis_cpu],
        gateway_cpu_s_per_request=single["gateway_cpu_per_request"][0],
        jobs_per_turn=report.raw["jobs_per_turn"][DEFAULT_PRESET]["total"],
    )
    report.raw["measured"] = asdict(measured)
    report.sizing = [size(n, measured, assume) for n in SESSIONS]
    per_session = report.sizing[0]["bytes_per_session"]
    report.sources += [
        f"sizing, Redis data: {per_session / 1024:,.1f} KiB per session at "
        f"{assume.messages_per_session:,} messages (--messages-per-session; linear between "
        f"the measured lengths {', '.join(f'{n:,}' for n in plan.lengths)}), * sessions; "
        f"replicas: * (1 + {assume.replicas}) (--replicas); masters by memory: "
        f"{assume.node_memory_gib:g} GiB usable each (--node-memory-gib).",
        f"sizing, req/s: sessions * {assume.turns_per_session_per_hour:g} turns/hour / 3600 "
        "(--turns-per-session-per-hour), one request per turn.",
        f"sizing, masters by CPU: req/s * {measured.redis_cpu_s_per_request * 1e6:,.0f} µs "
        "(Redis CPU per request on the cluster: "
        f"{REDIS_CPU[redis_cpu]}, "
        f"--redis-cpu) / {assume.redis_cpu_headroom:g} of a core (--redis-cpu-headroom); "
        "at least 3 masters; total nodes = masters * (1 + replicas).",
        f"sizing, gateway cores: req/s * {measured.gateway_cpu_s_per_request * 1e6:,.0f} µs "
        f"(gateway CPU per request in throughput (a)) / {assume.redis_cpu_headroom:g} "
        "(the same headroom); the summarization worker's CPU is not included.",
        f"sizing, summarizer calls/s: req/s * {measured.jobs_per_turn:.3f} jobs per turn of "
        f"{DEFAULT_PRESET} (one model call each).",
    ]
    return report


def markdown(report: Report) -> str:
    measured = table(
        ("area", "measure", "value", "detail"), (asdict(r).values() for r in report.rows)
    )
    sizing = table(SIZING_HEADER, (sizing_cells(row) for row in report.sizing))
    sources = "\n".join(f"- {line}" for line in report.sources)
    return f"{measured}\n\n{sizing}\n\nWhere each number comes from:\n\n{sources}"


def _log_tails(work: Path, lines: int = 15) -> str:
    tails = []
    for log in sorted(work.glob("*.log")):
        text = log.read_text(errors="replace").splitlines()[-lines:]
        if text:
            tails.append(f"--- {log.name}\n" + "\n".join(text))
    return "\n".join(tails)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Assumptions()
    parser.add_argument("--quick", action="store_true", help="smoke run, ~40 s")
    parser.add_argument("--json", help="also write both tables and the raw numbers here")
    parser.add_argument(
        "--seconds", type=float, help="each throughput run (default 10, 3 with --quick)"
    )
    parser.add_argument("--messages-per-session", type=int, default=defaults.messages_per_session)
    parser.add_argument(
        "--turns-per-session-per-hour", type=float, default=defaults.turns_per_session_per_hour
    )
    parser.add_argument(
        "--node-memory-gib", type=float, default=defaults.node_memory_gib,
        help="usable memory per master",
    )  # fmt: skip
    parser.add_argument("--replicas", type=int, default=defaults.replicas)
    parser.add_argument(
        "--redis-cpu-headroom", type=float, default=defaults.redis_cpu_headroom,
        help="fraction of one core a master (and a gateway core) may spend",
    )  # fmt: skip
    parser.add_argument(
        "--redis-cpu", choices=tuple(REDIS_CPU), default="process",
        help="Redis CPU per request the sizing uses: "
        + "; ".join(f"{k}: {v}" for k, v in REDIS_CPU.items()) + " (default: process)",
    )  # fmt: skip
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if args.seconds is not None:
        plan = Plan(plan.lengths, plan.sessions_per_length, plan.redis_n, args.seconds)
    assume = Assumptions(
        messages_per_session=args.messages_per_session,
        turns_per_session_per_hour=args.turns_per_session_per_hour,
        node_memory_gib=args.node_memory_gib,
        replicas=args.replicas,
        redis_cpu_headroom=args.redis_cpu_headroom,
    )
    work = Path(tempfile.mkdtemp(prefix="mg-sizing-"))
    started = time.monotonic()
    try:
        report = run(plan, assume, work, args.redis_cpu)
    except Exception:
        print(_log_tails(work), file=sys.stderr)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.settings["wall_s"] = round(time.monotonic() - started, 1)
    print(markdown(report))
    print(f"\n{report.settings}")
    if args.json:
        document = {**asdict(report), "markdown": markdown(report)}
        Path(args.json).write_text(json.dumps(document, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
