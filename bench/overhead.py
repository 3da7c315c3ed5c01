"""What the gateway adds: latency, throughput, streams held, Redis work, memory, vs LiteLLM.

Every party runs in its own process, as in production: a private redis-server (AOF off,
no RDB snapshots), the fast fake upstream (``bench/fast_upstream.py``), the gateway
(``memory-gateway serve`` from a generated config, one uvicorn worker, the in-process
summarization worker on), LiteLLM's proxy (one worker, ``--litellm PATH``) in front of
the same upstream, and the load generator (``bench/load.py``, aiohttp). One table is
printed (markdown) and ``--json FILE`` keeps it with the raw numbers.

    .venv/bin/python bench/overhead.py --quick                  # smoke run, ~1.5 min
    .venv/bin/python bench/overhead.py --litellm /tmp/litellm-venv/bin/litellm --json out.json
    .venv/bin/python bench/overhead.py --quick --sessions-only --profile /tmp/prof

Sections:

- **probe**: concurrency 1, streaming (5 chunks, no delay), direct / gateway with
  ``X-Session-Id`` / gateway without it interleaved; added p50 and p99 of the time to
  response headers, first SSE event and last byte (a target's quantile minus the direct
  one's). Then direct / LiteLLM, interleaved on their own: LiteLLM keeps a core busy
  after each answer (its post-call hooks; a c=1 run keeps it at ~99%), and interleaved
  with the gateway that work ran during the gateway's and direct's requests (in one
  run: direct's p50 0.20 -> 0.44 ms, the gateway's added 0.74 -> 1.72 ms). Each proxy
  is measured against direct in its own phase, as it would run alone.
- **sweep**: non-streaming, instant upstream, closed loop at each concurrency: req/s,
  p50/p99. The direct rows are the upstream's (and the load generator's) own capacity:
  what the gateway's numbers can at most reach. The target (memory ≥ 1,000 req/s at 32
  clients) names the machine it is for (cores, CPU model: also the table's first row).
  After every LiteLLM run the bench waits until its process is idle again, so that
  its leftover work does not land on the next target's run.
- **hold**: 64/256/1,024 concurrent streams of 0.7 s (7 chunks 100 ms apart): errors,
  timeouts, req/s, p99 total time; the gateway's RSS is sampled during the 256 run.
- **redis**: ``INFO stats commandstats`` before and after a fixed number of requests at
  concurrency 1 on a gateway with the in-process worker off (so every command counted is
  on the request path): commands per request by name; round trips per request from
  ``total_reads_processed`` (each read event of a client socket: a pipeline or a script
  call arrives as one, so with one request at a time it counts round trips); the bench's
  own INFO calls are subtracted.
- **bytes**: ``MEMORY USAGE`` of every key of a session after 10 and 100 turns (jobs
  done), and ``used_memory`` growth per session.
- **sessions**: where users are, not fresh sessions: sessions of 10 and of 400 messages
  (imported through the memory API, then grown live by every request with a new
  message), on a gateway with the in-process worker on and their summary jobs left
  pending (never flushed), in two variants: a working summarizer (the test suite's fake
  upstream, ``slow-summarizer``: a valid answer after ``--summarizer-ms``) and a failing
  one (the fast upstream's ``bench-summarizer``, whose "ok ok …" every summary rule
  refuses: the model-free fallback runs at once, in the gateway's process). Concurrency
  1, one keep-alive client (``bench/live_sessions.py``): direct, the 10- and the
  400-message sessions, non-streamed and streamed, interleaved as the probe's. Added p50
  and p99 of the whole non-streamed answer and of the first SSE event, and the ratio
  400 / 10 of the added p50 (targets: ≤ +2 ms, ≤ 1.3x). ``--profile DIR``: then the
  400-message sessions alone are driven for PROFILE_ROUNDS more rounds while py-spy
  records the gateway (raw collapsed stacks, ``DIR/sessions-<variant>-400.txt``).

Times are wall-clock on whatever machine runs it; ratios taken in one run (gateway vs
direct, gateway vs LiteLLM) travel better than absolute numbers. ``--json`` records the
commit, the machine and the library versions with them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import live_sessions  # noqa: E402
from bench._harness import (  # noqa: E402
    SUMMARIZER_SERVER,
    commit,
    cpu_seconds,
    free_port,
    machine,
    ms,
    quantile,
    rss_kib,
    table,
    versions,
)
from devsupport.servers import RedisProcess  # noqa: E402

PYTHON = sys.executable
PROBE_MODEL = "bench-t0-c5-s0"  # streamed: 5 chunks at once
INSTANT_MODEL = "bench-t0-c1-s0"  # non-streaming, no delay
HOLD_MODEL = "bench-t0-c7-s100"  # 7 chunks 100 ms apart: a 0.7 s stream
SUMMARIZER_MODEL = "bench-summarizer"  # answers "ok …": the model-free fallback summarizes
# The test suite's fake upstream's summarizer: a valid answer after --summarizer-ms.
WORKING_SUMMARIZER = "slow-summarizer"
MODELS = (PROBE_MODEL, INSTANT_MODEL, HOLD_MODEL, SUMMARIZER_MODEL)
NOT_RUN = "not run"


@dataclass(frozen=True)
class Plan:
    probe_n: int
    sweep: tuple[int, ...]
    sweep_s: float
    hold: tuple[int, ...]
    hold_s: float
    redis_n: int
    turns: tuple[int, ...]
    sessions_per_size: int
    live_n: int  # rounds of the sessions section (each: 6 requests)


FULL = Plan(500, (1, 8, 32, 128), 5.0, (64, 256, 1024), 6.0, 200, (10, 100), 3, 300)
QUICK = Plan(60, (1, 32), 1.0, (256,), 2.5, 40, (10,), 1, 60)


@dataclass(frozen=True)
class Row:
    area: str
    measure: str
    direct: str = "-"
    memory: str = "-"  # gateway, with X-Session-Id
    passthrough: str = "-"  # gateway, no session
    litellm: str = "-"
    target: str = ""
    met: str = ""


@dataclass
class Report:
    settings: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)


# --- processes ----------------------------------------------------------------------------


def _raise_nofile() -> None:
    # 1,024 streams through a proxy hold 2,048 sockets in it.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16384)), hard))


@contextlib.contextmanager
def process(
    args: list[str],
    ready_url: str | None,  # None: no HTTP to wait for (``memory-gateway worker``)
    log: Path,
    env: dict[str, str] | None = None,
    wait_s: float = 60,
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process (its own session, killed with its group), up once ready_url answers."""
    with log.open("wb") as out:
        child = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=ROOT,
            preexec_fn=_raise_nofile,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + wait_s
        while ready_url is not None:
            if child.poll() is not None:
                raise RuntimeError(f"{args[0]} exited: see {log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready_url, timeout=1).status_code < 500:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{args[0]} not ready after {wait_s:.0f} s: see {log}")
            time.sleep(0.1)
        yield child
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(5)


def gateway_config(
    path: Path,
    upstream: str,
    redis_url: str,
    *,
    worker: bool,
    summarizer: tuple[str, str] | None = None,  # (base URL, model); None: the upstream's
) -> Path:
    base_url, model = summarizer or (None, SUMMARIZER_MODEL)
    config = {
        # The load generator is one client address and one tenant holding up to 1,024
        # streams: not capped as one abusive client would be
        # (server.max_connections_per_client), nor refused past one tenant's share of
        # the upstream pool (upstream.tenant_share: 5,793 of the 1,024-stream hold's
        # requests were 429 at the default 0.25).
        "server": {"log_level": "warning", "max_connections_per_client": 0},
        "upstream": {"base_url": upstream, "tenant_share": 1},
        "redis": {"url": redis_url},
        "summarizer": {"model": model} | ({"base_url": base_url} if base_url else {}),
        "worker": {"in_process": worker},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def litellm_config(path: Path, upstream: str, master_key: str) -> Path:
    models = [
        {
            "model_name": model,
            "litellm_params": {"model": f"openai/{model}", "api_base": upstream, "api_key": "sk-x"},
        }
        for model in MODELS
    ]
    # A master key, as any deployment has (LiteLLM refuses to start without one): the
    # bench's bearer key, so every target gets the same request headers.
    config = {
        "model_list": models,
        "litellm_settings": {"drop_params": True},
        "general_settings": {"master_key": master_key},
    }
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def rss_peak(pid: int) -> Iterator[list[int]]:
    """Samples VmRSS every 50 ms while the block runs; the list holds the peak at the end."""
    peak = [rss_kib(pid)]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            with contextlib.suppress(OSError):
                peak[0] = max(peak[0], rss_kib(pid))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()


def settle(
    pid: int | None, *, idle: float = 0.05, every_s: float = 0.1, limit_s: float = 30
) -> None:
    """Wait until the process ``pid`` uses under ``idle`` of a core (LiteLLM's work after
    its answers must not run during the next target's requests)."""
    if pid is None:
        return
    deadline = time.monotonic() + limit_s
    before = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(every_s)
        now = cpu_seconds(pid)
        if now - before < idle * every_s:
            return
        before = now


# --- load ---------------------------------------------------------------------------------


def run_load(job: dict[str, Any], script: str = "load.py") -> dict[str, Any]:
    """One job of ``bench/load.py`` (or another load generator), in a process of its own."""
    done = subprocess.run(
        [PYTHON, str(ROOT / "bench" / script)],
        input=json.dumps(job).encode(),
        capture_output=True,
        preexec_fn=_raise_nofile,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed: {done.stderr.decode()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def problems(result: dict[str, Any]) -> str:
    """ " (3 errors, 5 degraded)" for a closed-loop run; "" when every answer was clean."""
    found = []
    if result["errors"]:
        found.append(f"{sum(result['errors'].values())} errors")
    if result["memory"].get("degraded"):
        found.append(f"{result['memory']['degraded']} degraded")
    return f" ({', '.join(found)})" if found else ""


def targets(urls: dict[str, str], key: str) -> dict[str, dict[str, Any]]:
    """Load-generator targets by column: direct, memory, passthrough, litellm."""
    auth = {"Authorization": f"Bearer {key}"}
    run = uuid.uuid4().hex[:8]
    specs = {
        "direct": {"url": urls["direct"], "headers": auth},
        "memory": {"url": urls["gateway"], "headers": auth, "session_prefix": f"b-{run}"},
        "passthrough": {"url": urls["gateway"], "headers": auth},
    }
    if "litellm" in urls:
        specs["litellm"] = {"url": urls["litellm"], "headers": auth}
    return {name: {"name": name, **spec} for name, spec in specs.items()}


# --- sections -----------------------------------------------------------------------------


STAGES = (("headers", "response headers"), ("first", "first SSE event"), ("last", "last byte"))


# The direct calls interleaved with LiteLLM's probe: its added latency is counted from them.
PEER_DIRECT = "direct (LiteLLM phase)"


def _probe_phase(specs: dict[str, dict[str, Any]], plan: Plan) -> dict[str, list[dict[str, Any]]]:
    result = run_load(
        {"kind": "probe", "targets": list(specs.values()), "n": plan.probe_n, "model": PROBE_MODEL}
    )
    timings: dict[str, list[dict[str, Any]]] = result["timings"]
    return timings


def probe(
    report: Report, specs: dict[str, dict[str, Any]], plan: Plan, peer_pid: int | None = None
) -> None:
    """The gateway's targets and direct interleaved; then LiteLLM and direct on their own
    (see the module's notes), once LiteLLM is idle."""
    timings = _probe_phase({k: v for k, v in specs.items() if k != "litellm"}, plan)
    if "litellm" in specs:
        settle(peer_pid)
        peer = _probe_phase({"direct": specs["direct"], "litellm": specs["litellm"]}, plan)
        settle(peer_pid)
        timings |= {"litellm": peer["litellm"], PEER_DIRECT: peer["direct"]}
    errors = {name: sum(1 for t in runs if t["error"]) for name, runs in timings.items()}
    for name, runs in timings.items():
        if errors[name] == len(runs):
            raise RuntimeError(f"probe: every request to {name} failed, e.g. {runs[0]}")
    stats: dict[str, dict[str, dict[str, float]]] = {}
    for name, runs in timings.items():
        ok = [t for t in runs if not t["error"]]
        stats[name] = {
            stage: {
                "p50": quantile([t[stage] for t in ok], 0.5),
                "p99": quantile([t[stage] for t in ok], 0.99),
            }
            for stage, _ in STAGES
        }
    report.raw["probe"] = {"n": plan.probe_n, "errors": errors, "quantiles_s": stats}
    for stage, label in STAGES:
        for q in ("p50", "p99"):
            cells = {"direct": ms(stats["direct"][stage][q])}
            for name in ("memory", "passthrough", "litellm"):
                if name in stats:
                    cells[name] = "+" + ms(added(stats, name, stage, q))
            target, met = "", ""
            if stage == "first":
                limit = 0.0015 if q == "p50" else 0.005
                target = f"memory ≤ +{limit * 1000:g} ms"
                met = "yes" if added(stats, "memory", stage, q) <= limit else "no"
            report.rows.append(
                Row(
                    "probe c=1",
                    f"{label} {q} (added)",
                    target=target,
                    met=met,
                    litellm=cells.get("litellm", NOT_RUN),
                    **{k: v for k, v in cells.items() if k != "litellm"},
                )
            )
    report.rows.append(
        Row("probe c=1", "errors", **{k: str(v) for k, v in _columns(errors).items()})
    )
    if PEER_DIRECT in stats:
        direct = stats[PEER_DIRECT]["first"]
        report.rows.append(
            Row(
                "probe c=1",
                "first SSE event p50 / p99, direct in LiteLLM's phase",
                direct=f"{ms(direct['p50'])} / {ms(direct['p99'])}",
            )
        )


def added(stats: dict[str, dict[str, dict[str, float]]], name: str, stage: str, q: str) -> float:
    """A target's quantile over that of the direct calls interleaved with it."""
    direct = PEER_DIRECT if name == "litellm" else "direct"
    return stats[name][stage][q] - stats[direct][stage][q]


def _columns(values: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in values.items() if k in ("direct", "memory", "passthrough")}
    out["litellm"] = values.get("litellm", NOT_RUN)
    return out


def closed_loop(
    spec: dict[str, Any],
    model: str,
    concurrency: int,
    seconds: float,
    stream: bool,
    keep_totals: bool = False,  # keep every request's total time (to merge runs)
    sessions: int | None = None,  # the pool of sessions (None: load.py's, 1,000 at most c)
) -> dict[str, Any]:
    job: dict[str, Any] = {
        "kind": "closed",
        "target": spec,
        "model": model,
        "concurrency": concurrency,
        "duration_s": seconds,
        "stream": stream,
        "timeout_s": 10,
        "warmup": 5,
    }
    if sessions is not None:
        job["sessions"] = sessions
    result = run_load(job)
    totals = result["totals"] if keep_totals else result.pop("totals")
    result["p50_s"] = quantile(totals, 0.5)
    result["p99_s"] = quantile(totals, 0.99)
    return result


def sweep(
    report: Report, specs: dict[str, dict[str, Any]], plan: Plan, peer_pid: int | None = None
) -> None:
    raw: dict[str, dict[str, Any]] = {}
    cpu = report.settings.get("machine") or machine()
    where = f"{cpu['cores']} cores ({cpu['cpu']})"
    for concurrency in plan.sweep:
        runs = {}
        for name, spec in specs.items():
            runs[name] = closed_loop(spec, INSTANT_MODEL, concurrency, plan.sweep_s, stream=False)
            if name == "litellm":
                settle(peer_pid)
        raw[str(concurrency)] = runs
        rps = {name: f"{r['rps']:.0f}" for name, r in runs.items()}
        best = max(r["rps"] for name, r in runs.items() if name == "memory")
        report.rows.append(
            Row(
                f"sweep c={concurrency}",
                "req/s (non-streaming)",
                # A throughput is a machine's: the target says which.
                target=f"memory ≥ 1000 on {where}" if concurrency >= 32 else "",
                met=("yes" if best >= 1000 else "no") if concurrency >= 32 else "",
                **_columns(rps),
            )
        )
        lat = {
            name: f"{ms(r['p50_s'], 1)} / {ms(r['p99_s'], 1)}" + problems(r)
            for name, r in runs.items()
        }
        report.rows.append(Row(f"sweep c={concurrency}", "p50 / p99", **_columns(lat)))
    report.raw["sweep"] = raw
    top = str(max(plan.sweep))
    if "litellm" in raw[top]:
        litellm_rps = max(raw[top]["litellm"]["rps"], 1e-9)
        ratio = raw[top]["memory"]["rps"] / litellm_rps
        passthrough = raw[top]["passthrough"]["rps"] / litellm_rps
        report.rows.append(
            Row(
                "vs LiteLLM",
                f"throughput at c={top}: gateway / LiteLLM",
                memory=f"{ratio:.1f}x",
                passthrough=f"{passthrough:.1f}x",
                litellm="1x",
                target="≥ 5x",
                met="yes" if ratio >= 5 else "no",
            )
        )
    else:
        report.rows.append(Row("vs LiteLLM", "throughput ratio", litellm=NOT_RUN, target="≥ 5x"))


def latency_ratio(report: Report) -> None:
    stats = report.raw["probe"]["quantiles_s"]
    if "litellm" not in stats:
        report.rows.append(Row("vs LiteLLM", "added latency ratio", litellm=NOT_RUN, target="≥ 5x"))
        return
    for q in ("p50", "p99"):
        gateway = max(added(stats, "memory", "first", q), 1e-6)
        passthrough = max(added(stats, "passthrough", "first", q), 1e-6)
        litellm = added(stats, "litellm", "first", q)
        ratio = litellm / gateway
        report.rows.append(
            Row(
                "vs LiteLLM",
                f"added to first event {q}: LiteLLM / gateway",
                memory=f"{ratio:.1f}x",
                passthrough=f"{litellm / passthrough:.1f}x",
                litellm="1x",
                target="≥ 5x",
                met="yes" if ratio >= 5 else "no",
            )
        )


def hold(
    report: Report,
    specs: dict[str, dict[str, Any]],
    plan: Plan,
    gateway_pid: int,
    peer_pid: int | None = None,
) -> None:
    raw: dict[str, dict[str, Any]] = {}
    for streams in plan.hold:
        runs: dict[str, dict[str, Any]] = {}
        for name, spec in specs.items():
            if name == "passthrough":
                continue
            if name == "memory":
                with rss_peak(gateway_pid) as peak:
                    runs[name] = closed_loop(spec, HOLD_MODEL, streams, plan.hold_s, stream=True)
                runs[name]["rss_peak_kib"] = peak[0]
            else:
                runs[name] = closed_loop(spec, HOLD_MODEL, streams, plan.hold_s, stream=True)
                if name == "litellm":
                    settle(peer_pid)
        raw[str(streams)] = runs
        area = f"hold {streams}x0.7 s"
        cells = {name: f"{r['rps']:.0f} req/s" for name, r in runs.items()}
        report.rows.append(
            Row(
                area,
                "req/s (ideal: streams / 0.7 s)",
                **_columns(cells),
                target=f"{streams / 0.7:.0f}",
            )
        )
        cells = {name: f"{ms(r['p50_s'], 0)} / {ms(r['p99_s'], 0)}" for name, r in runs.items()}
        report.rows.append(Row(area, "p50 / p99 total time", **_columns(cells)))
        cells = {
            name: f"{sum(r['errors'].values())} / {r['timeouts']}"
            + ("" if name != "memory" else f", degraded {r['memory'].get('degraded', 0)}")
            for name, r in runs.items()
        }
        # A degraded answer lost its memory (Redis missed its deadline): not clean either.
        gateway_run = runs["memory"]
        clean = not gateway_run["errors"] and not gateway_run["memory"].get("degraded")
        report.rows.append(
            Row(
                area,
                "errors / timeouts",
                **_columns(cells),
                target="memory: 0, 0 degraded" if streams >= 250 else "",
                met=("yes" if clean else "no") if streams >= 250 else "",
            )
        )
        report.rows.append(
            Row(area, "gateway RSS peak", memory=f"{runs['memory']['rss_peak_kib'] / 1024:.0f} MiB")
        )
    report.raw["hold"] = raw


def _info(client: redis.Redis) -> dict[str, Any]:
    info: dict[str, Any] = client.execute_command("INFO", "stats", "commandstats")
    return info


def _command_counts(info: dict[str, Any], stat: str = "calls") -> dict[str, int]:
    """One of INFO commandstats' numbers (``calls``, ``usec``) by command name."""
    return {
        name.removeprefix("cmdstat_"): int(value[stat])
        for name, value in info.items()
        if name.startswith("cmdstat_")
    }


def count_commands(
    redis_client: redis.Redis | Sequence[redis.Redis], send: Any, n: int
) -> dict[str, Any]:
    """Commands and round trips per request for ``send()`` called n times.

    Several clients (a cluster's masters, one plain client each): summed over their
    servers; a replica's acknowledgements (``REPLCONF ACK``, one read each) are left out.
    ``usec``: the commands' time per request as Redis counts it (the bench's INFO left
    out); a script's time includes the commands it runs, counted again under their names
    (``usec_commands``: by name).
    """
    clients = [redis_client] if isinstance(redis_client, redis.Redis) else list(redis_client)
    before = [_info(client) for client in clients]
    for _ in range(n):
        send()
    after = [_info(client) for client in clients]

    def summed(infos: list[dict[str, Any]], stat: str = "calls") -> Counter[str]:
        return sum((Counter(_command_counts(info, stat)) for info in infos), Counter())

    calls_before, calls_after = summed(before), summed(after)
    calls_before["info"] += len(clients)  # the 'before' INFOs themselves
    acks = calls_after.pop("replconf", 0) - calls_before.pop("replconf", 0)
    per_request = {
        name: (calls_after[name] - calls_before.get(name, 0)) / n
        for name in sorted(calls_after)
        if calls_after[name] != calls_before.get(name, 0)
    }
    reads = sum(
        a["total_reads_processed"] - b["total_reads_processed"]
        for a, b in zip(after, before, strict=True)
    )
    reads -= len(clients) + acks  # the 'after' INFOs' reads
    usec = summed(after, "usec") - summed(before, "usec")
    for name in ("info", "replconf"):
        usec.pop(name, None)
    return {
        "commands": per_request,
        "round_trips": reads / n,
        "n": n,
        "usec": sum(usec.values()) / n,
        "usec_commands": {name: usec[name] / n for name in sorted(usec)},
    }


def redis_work(report: Report, http: httpx.Client, redis_client: redis.Redis, plan: Plan) -> None:
    """Counted on a gateway without the in-process worker: only the request path runs."""
    run = uuid.uuid4().hex[:8]
    counter = iter(range(10**9))

    def chat(session: str | None, stream: bool = False) -> None:
        n = next(counter)
        headers = {"X-Session-Id": session} if session else {}
        body = {
            "model": PROBE_MODEL if stream else INSTANT_MODEL,
            "stream": stream,
            "messages": [{"role": "user", "content": f"note {n} about the garden"}],
        }
        response = http.post("/v1/chat/completions", json=body, headers=headers)
        response.raise_for_status()

    warm = [f"r-{run}-warm-{i}" for i in range(10)]
    for _ in range(10):  # ten sessions of ten turns: continuing conversations
        for session in warm:
            chat(session)
    cases = {
        "new session": lambda: chat(f"r-{run}-new-{next(counter)}"),
        "continuing (turn 11+)": lambda: chat(warm[next(counter) % len(warm)]),
        "continuing, streamed": lambda: chat(warm[next(counter) % len(warm)], stream=True),
        "passthrough": lambda: chat(None),
    }
    idle = count_commands(redis_client, lambda: time.sleep(0.5), 1)
    raw = {"idle_0.5s": idle}
    for label, send in cases.items():
        raw[label] = counted = count_commands(redis_client, send, plan.redis_n)
        commands = ", ".join(f"{k} {v:g}" for k, v in counted["commands"].items()) or "none"
        column = "passthrough" if label == "passthrough" else "memory"
        trips = counted["round_trips"]
        report.rows.append(
            Row(
                "redis",
                f"{label}: round trips / request",
                **{column: f"{trips:.2f}"},
                target="≤ 2",
                met="yes" if trips <= 2.05 else "no",
            )
        )
        report.rows.append(
            Row(
                "redis",
                f"{label}: commands executed / request (script bodies included)",
                **{column: commands},
            )
        )
    report.raw["redis"] = raw


def session_bytes(
    report: Report, http: httpx.Client, redis_client: redis.Redis, plan: Plan
) -> None:
    """MEMORY USAGE of a session's keys after T turns (its jobs done), on the main gateway."""
    raw: dict[str, Any] = {}
    for turns in plan.turns:
        sizes, grown = [], []
        for i in range(plan.sessions_per_size):
            session = f"m-{uuid.uuid4().hex[:8]}-{i}"
            keys_before = set(redis_client.scan_iter(match="mg:{*", count=1000))
            used_before = int(redis_client.info("memory")["used_memory"])
            for turn in range(turns):
                topic = ("garden", "budget", "trip")[turn % 3]
                text = f"turn {turn}: my note about the {topic} is number {turn * 37 % 1000}"
                body = {"model": INSTANT_MODEL, "messages": [{"role": "user", "content": text}]}
                http.post(
                    "/v1/chat/completions", json=body, headers={"X-Session-Id": session}
                ).raise_for_status()
            wait_for_jobs(http, session)
            keys = set(redis_client.scan_iter(match="mg:{*", count=1000)) - keys_before
            sizes.append(sum(redis_client.memory_usage(k, samples=0) or 0 for k in keys))
            grown.append(int(redis_client.info("memory")["used_memory"]) - used_before)
        raw[str(turns)] = {"memory_usage_bytes": sizes, "used_memory_growth": grown}
        size = statistics.mean(sizes)
        report.rows.append(
            Row(
                "redis",
                f"bytes per session at {turns} turns (MEMORY USAGE)",
                memory=f"{size / 1024:.1f} KiB ({size / turns:.0f} B/turn)",
            )
        )
        report.rows.append(
            Row(
                "redis",
                f"used_memory growth per session at {turns} turns (noisy)",
                memory=f"{statistics.mean(grown) / 1024:.1f} KiB",
            )
        )
    report.raw["bytes"] = raw


def wait_for_jobs(http: httpx.Client, session: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = http.get(f"/memory/sessions/{session}").json()
        if not state.get("pending_jobs"):
            return
        time.sleep(0.1)
    raise RuntimeError(f"session {session}: jobs still pending after {timeout_s} s")


# --- live sessions ------------------------------------------------------------------------

LIVE_SIZES = (10, 400)  # messages per session when imported
# Sessions per size: enough that none grows by more than this many turns (a turn is two
# messages): a 10-message session stays a short one, a 400-message one stays ~400.
LIVE_TURNS_PER_SESSION = 5
LIVE_WARMUP = 5  # rounds sent first, not counted (connections, first-request costs)
LIVE_ADDED_P50_S = 0.002  # issue 33: added p50 on the 400-message session
LIVE_RATIO = 1.3  # ... and at most this times the 10-message session's
LIVE_MODES = {"json": "non-streamed, whole answer", "sse": "first SSE event"}
# --profile: rounds of requests to the longest sessions alone, driven under py-spy after
# the measured ones (py-spy's sampling slows the process it samples).
PROFILE_ROUNDS = 300


@dataclass(frozen=True)
class Summarizer:
    """One variant of the sessions section: the summarizer the gateway's worker calls."""

    name: str
    model: str
    delay_s: float | None  # the fake summarizer's delay; None: the fast upstream's model


def summarizers(delay_ms: float) -> tuple[Summarizer, ...]:
    return (
        Summarizer("working summarizer", WORKING_SUMMARIZER, delay_ms / 1000),
        Summarizer("failing summarizer", SUMMARIZER_MODEL, None),
    )


@contextlib.contextmanager
def py_spy(pid: int, output: Path | None) -> Iterator[None]:
    """py-spy records ``pid`` while the block runs, as raw collapsed stacks (one line a
    stack: frames by ``;``, then its samples); nothing when ``output`` is None.

    1,000 a second: a few seconds of requests are thousands of samples. The process is
    paused for each (py-spy's default): ``--nonblocking`` took the event loop's idle
    waits for work (``Runner.run`` as the leaf frame: uvloop's own C code, busy or not).
    A thread-pool thread waiting for work is sampled (its leaf frame is ``_worker``).
    """
    if output is None:
        yield
        return
    spy = shutil.which("py-spy") or str(Path(PYTHON).with_name("py-spy"))
    options = ["--rate", "1000", "--format", "raw", "-o", str(output)]
    recorder = subprocess.Popen(
        [spy, "record", "--pid", str(pid), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)  # py-spy writes what it has, then exits
        _, err = recorder.communicate(timeout=60)
        if not output.exists():
            raise RuntimeError(f"py-spy wrote nothing: {err.decode()[-2000:]}")


def summary_outcomes(http: httpx.Client) -> dict[str, float]:
    """The gateway's summarizer answers so far by outcome (ok, rejected, failed, fallback):
    which the variant's summarizer was, working or not."""
    text = http.get("/metrics").text
    prefix = "memory_gateway_summaries_total{outcome="
    return {
        line[len(prefix) :].split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


def drive_sessions(
    http: httpx.Client, gateway_url: str, upstream: str, key: str, plan: Plan, pid: int,
    profile: Path | None,
) -> dict[str, Any]:  # fmt: skip
    """Import each size's sessions (jobs left pending), then drive them with direct."""
    run_id = uuid.uuid4().hex[:8]
    turns = (plan.live_n + LIVE_WARMUP) * len(LIVE_MODES)
    count = live_sessions.pool(turns, LIVE_TURNS_PER_SESSION)
    ids = {size: [f"live-{run_id}-{size}-{i}" for i in range(count)] for size in LIVE_SIZES}
    started = time.monotonic()
    for size in LIVE_SIZES:
        live_sessions.import_sessions(http, ids[size], size, seed=size)
    imported_s = time.monotonic() - started
    before = {size: live_sessions.states(http, ids[size]) for size in LIVE_SIZES}
    auth = {"Authorization": f"Bearer {key}"}
    job = {
        "targets": [
            {"name": live_sessions.DIRECT, "url": upstream, "headers": auth},
            *(
                {"name": str(size), "url": gateway_url, "headers": auth, "sessions": ids[size]}
                for size in LIVE_SIZES
            ),
        ],
        "n": plan.live_n,
        "warmup": LIVE_WARMUP,
        "models": {"json": INSTANT_MODEL, "sse": PROBE_MODEL},
        "timeout_s": 30,
    }
    cpu = cpu_seconds(pid)
    started = time.monotonic()
    timings = run_load(job, "live_sessions.py")["timings"]
    driven_s, cpu_s = time.monotonic() - started, cpu_seconds(pid) - cpu
    errors = {name: sum(1 for t in runs if t["error"]) for name, runs in timings.items()}
    for name, runs in timings.items():
        if errors[name] == len(runs):
            raise RuntimeError(f"sessions: every request to {name} failed, e.g. {runs[0]}")
    after = {size: live_sessions.states(http, ids[size]) for size in LIVE_SIZES}
    summaries = summary_outcomes(http)
    if profile is not None:  # the longest sessions' requests, and what runs beside them
        longest = [t for t in job["targets"] if t["name"] == str(max(LIVE_SIZES))]
        profiled = job | {"targets": longest, "n": PROFILE_ROUNDS, "warmup": 0}
        with py_spy(pid, profile):
            run_load(profiled, "live_sessions.py")
    return {
        "sessions_per_size": count,
        "import_s": round(imported_s, 1),
        "driven_s": round(driven_s, 1),
        "gateway_cpu_percent": round(cpu_s / driven_s * 100, 1),
        "before": before,
        "after": after,
        "summaries": summaries,
        "errors": errors,
        "quantiles_s": live_sessions.summary(timings),
    }


def live_rows(report: Report, variant: str, raw: dict[str, Any]) -> None:
    area = f"sessions, {variant}"
    short, long = (str(size) for size in LIVE_SIZES)
    before, after = raw["before"], raw["after"]
    sizes = ", ".join(
        f"{before[size]['messages_mean']:.0f} → {after[size]['messages_mean']:.0f}"
        for size in LIVE_SIZES
    )
    pending = sum(before[size]["pending_jobs"] for size in LIVE_SIZES)
    pending_after = sum(after[size]["pending_jobs"] for size in LIVE_SIZES)
    report.rows.append(
        Row(
            area,
            f"{raw['sessions_per_size']} sessions a size: messages (mean) {sizes}; "
            f"jobs pending {pending} → {pending_after}; gateway CPU {raw['gateway_cpu_percent']}%",
            memory="summarizer: "
            + ", ".join(f"{k} {v:.0f}" for k, v in raw["summaries"].items() if v),
        )
    )
    stats = raw["quantiles_s"]
    for mode, label in LIVE_MODES.items():
        for size in (short, long):
            row = stats[size][mode]
            target, met = "", ""
            if size == long:
                target = f"p50 ≤ +{LIVE_ADDED_P50_S * 1000:g} ms"
                met = "yes" if row["added_p50"] <= LIVE_ADDED_P50_S else "no"
            report.rows.append(
                Row(
                    area,
                    f"{size} messages: {label} p50 / p99 (added)",
                    direct=f"{ms(row['direct_p50'])} / {ms(row['direct_p99'])}",
                    memory=f"+{ms(row['added_p50'])} / +{ms(row['added_p99'])}",
                    target=target,
                    met=met,
                )
            )
        times = live_sessions.ratio(stats[long][mode]["added_p50"], stats[short][mode]["added_p50"])
        report.rows.append(
            Row(
                area,
                f"{long} / {short} messages: {label}, added p50",
                memory=f"{times:.2f}x",
                target=f"≤ {LIVE_RATIO:g}x",
                met="yes" if times <= LIVE_RATIO else "no",
            )
        )
    errors = {k: v for k, v in raw["errors"].items() if v}
    if errors:
        report.rows.append(Row(area, "errors", memory=str(errors)))


def live(
    report: Report, plan: Plan, work: Path, key: str, upstream: str, redis_url: str,
    summarizer_ms: float, profile: Path | None,
) -> None:  # fmt: skip
    """The sessions section: one gateway (in-process worker) per summarizer variant."""
    raw: dict[str, Any] = {}
    for variant in summarizers(summarizer_ms):
        slug = variant.name.split()[0]
        with contextlib.ExitStack() as stack:
            summarizer = None
            if variant.delay_s is not None:
                port = free_port()
                base = f"http://127.0.0.1:{port}/v1"
                stack.enter_context(
                    process(
                        [PYTHON, "-c", SUMMARIZER_SERVER, str(port), str(variant.delay_s)],
                        f"{base}/models",
                        work / f"summarizer-{slug}.log",
                    )
                )
                summarizer = (base, variant.model)
            port = free_port()
            config = gateway_config(
                work / f"gateway-{slug}.yaml", upstream, redis_url, worker=True,
                summarizer=summarizer,
            )  # fmt: skip
            serve = [PYTHON, "-m", "gateway.cli", "serve", "--config", str(config)]
            gateway = stack.enter_context(
                process(
                    [*serve, "--port", str(port)],
                    f"http://127.0.0.1:{port}/healthz",
                    work / f"gateway-{slug}.log",
                )
            )
            http = stack.enter_context(
                httpx.Client(
                    base_url=f"http://127.0.0.1:{port}",
                    timeout=60,
                    headers={"Authorization": f"Bearer {key}"},
                )
            )
            output = profile / f"sessions-{slug}-{max(LIVE_SIZES)}.txt" if profile else None
            raw[variant.name] = drive_sessions(
                http, f"http://127.0.0.1:{port}/v1", upstream, key, plan, gateway.pid, output
            )
            raw[variant.name]["summarizer"] = asdict(variant)
        live_rows(report, variant.name, raw[variant.name])
    report.raw["sessions"] = raw


# --- the run ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """What the command line chose beyond the plan."""

    litellm: str | None = None
    appendonly: bool = False
    separate_worker: bool = True
    sessions_only: bool = False
    summarizer_ms: float = 200.0
    profile: Path | None = None


def run(plan: Plan, options: Options, work: Path) -> Report:
    key = "sk-bench-" + secrets.token_urlsafe(16)
    worker = (
        "a separate `memory-gateway worker` process"
        if options.separate_worker
        else "the in-process worker"
    )
    settings: dict[str, Any] = {
        "plan": asdict(plan),
        "redis": "private redis-server, appendonly "
        f"{'yes' if options.appendonly else 'no'}, no RDB",
        "gateway": "memory-gateway serve: one uvicorn worker (httptools, uvloop), "
        f"log_level warning, defaults otherwise (preset, pools, timeouts); summarization: "
        f"{worker} (the sessions section: the in-process worker)",
        "summarizer_ms": options.summarizer_ms,
        "litellm": "not run",
        "cpus": os.cpu_count(),
        "machine": machine(),
        "commit": commit(),
        "versions": versions(),
    }
    report = Report(settings)
    cpu = settings["machine"]
    report.rows.append(Row("machine", f"{cpu['cores']} cores, {cpu['cpu']}"))
    redis_server = RedisProcess(appendonly=options.appendonly).start()
    try:
        up_port = free_port()
        upstream = f"http://127.0.0.1:{up_port}/v1"
        up_args = [PYTHON, str(ROOT / "bench" / "fast_upstream.py"), "--port", str(up_port)]
        with process(up_args, upstream + "/models", work / "upstream.log"):
            if not options.sessions_only:
                sections(report, plan, options, work, key, upstream, redis_server)
            live(
                report, plan, work, key, upstream, redis_server.url, options.summarizer_ms,
                options.profile,
            )  # fmt: skip
        return report
    finally:
        redis_server.cleanup()


def sections(
    report: Report, plan: Plan, options: Options, work: Path, key: str, upstream: str,
    redis_server: RedisProcess,
) -> None:  # fmt: skip
    """Every section but the sessions one: probe, sweep, hold, bytes, redis."""
    gw_port = free_port()
    serve = [PYTHON, "-m", "gateway.cli", "serve"]
    config = gateway_config(
        work / "gateway.yaml", upstream, redis_server.url, worker=not options.separate_worker
    )
    with contextlib.ExitStack() as stack:
        if options.separate_worker:  # summaries off the gateway's core, as in production
            # In ``stack``: stopped before Redis commands are counted below.
            stack.enter_context(
                process(
                    [PYTHON, "-m", "gateway.cli", "worker", "--config", str(config)],
                    None,
                    work / "worker.log",
                )
            )
        gateway = stack.enter_context(
            process(
                [*serve, "--config", str(config), "--port", str(gw_port)],
                f"http://127.0.0.1:{gw_port}/healthz",
                work / "gateway.log",
            )
        )
        urls = {"direct": upstream, "gateway": f"http://127.0.0.1:{gw_port}/v1"}
        peer_pid = None
        if options.litellm:
            ll_port = free_port()
            ll_config = litellm_config(work / "litellm.yaml", upstream, key)
            peer = stack.enter_context(
                process(
                    [
                        options.litellm,
                        "--config",
                        str(ll_config),
                        "--port",
                        str(ll_port),
                        "--num_workers",
                        "1",
                    ],
                    f"http://127.0.0.1:{ll_port}/health/liveliness",
                    work / "litellm.log",
                    env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"},
                    wait_s=180,
                )
            )
            urls["litellm"] = f"http://127.0.0.1:{ll_port}/v1"
            peer_pid = peer.pid
            report.settings["litellm"] = (
                f"{options.litellm} --num_workers 1, master key, drop_params"
            )
        specs = targets(urls, key)
        idle_rss = rss_kib(gateway.pid)
        probe(report, specs, plan, peer_pid)
        latency_ratio(report)
        sweep(report, specs, plan, peer_pid)
        hold(report, specs, plan, gateway.pid, peer_pid)
        http = httpx.Client(
            base_url=f"http://127.0.0.1:{gw_port}",
            timeout=30,
            headers={"Authorization": f"Bearer {key}"},
        )
        stack.callback(http.close)
        redis_client = redis_server.client()
        stack.callback(redis_client.close)
        session_bytes(report, http, redis_client, plan)
        report.rows.insert(
            1, Row("gateway", "RSS idle (after start)", memory=f"{idle_rss / 1024:.0f} MiB")
        )
    # The request path alone: a gateway without the in-process worker.
    config = gateway_config(
        work / "gateway-noworker.yaml", upstream, redis_server.url, worker=False
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            process(
                [*serve, "--config", str(config), "--port", str(gw_port)],
                f"http://127.0.0.1:{gw_port}/healthz",
                work / "gateway2.log",
            )
        )
        http = stack.enter_context(
            httpx.Client(
                base_url=f"http://127.0.0.1:{gw_port}",
                timeout=30,
                headers={"Authorization": f"Bearer {key}"},
            )
        )
        redis_client = redis_server.client()
        stack.callback(redis_client.close)
        redis_work(report, http, redis_client, plan)


def markdown(report: Report) -> str:
    header = (
        "area",
        "measure",
        "direct",
        "gateway (memory)",
        "gateway (passthrough)",
        "LiteLLM",
        "target",
        "met",
    )
    return table(header, (asdict(row).values() for row in report.rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run, about 1.5 minutes")
    parser.add_argument("--litellm", help="the litellm executable (its proxy is the peer)")
    parser.add_argument("--appendonly", action="store_true", help="Redis with AOF on")
    parser.add_argument("--json", help="also write the table and raw numbers here")
    parser.add_argument(
        "--in-process-worker",
        action="store_true",
        help="summarize inside the gateway process (default: a separate worker process)",
    )
    parser.add_argument(
        "--sessions-only", action="store_true", help="run the sessions section alone"
    )
    parser.add_argument(
        "--summarizer-ms",
        type=float,
        default=200.0,
        help="the sessions section's working summarizer: ms per answer",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="a directory: py-spy records the gateway while the sessions are driven",
    )
    args = parser.parse_args()
    if args.litellm and not shutil.which(args.litellm):
        parser.error(f"--litellm {args.litellm}: not an executable")
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    options = Options(
        litellm=args.litellm,
        appendonly=args.appendonly,
        separate_worker=not args.in_process_worker,
        sessions_only=args.sessions_only,
        summarizer_ms=args.summarizer_ms,
        profile=args.profile,
    )
    plan = QUICK if args.quick else FULL
    work = Path(tempfile.mkdtemp(prefix="mg-overhead-"))
    started = time.monotonic()
    try:
        report = run(plan, options, work)
    except RuntimeError:
        print(f"logs kept in {work}", file=sys.stderr)
        raise
    report.settings["wall_s"] = round(time.monotonic() - started, 1)
    shutil.rmtree(work, ignore_errors=True)
    print(markdown(report))
    print(f"\n{report.settings}")
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
