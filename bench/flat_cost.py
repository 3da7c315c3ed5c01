"""Flat cost as conversations grow, and summarization kept off the request path (issue 6).

Part 1, **cost per request against conversation length**. A real gateway process
(``memory-gateway serve``, external redis-server, ``bench/fast_upstream.py`` as the
upstream in its own process, ``worker.in_process: false`` so the process does request
work only) holds sessions of 10 / 100 / 1,000 / 10,000 messages, imported through the
memory API and flushed (summaries and facts made by the fake summarizer). Each request
is one new streamed user message asking for a fact stated outside the window (recall
must find it). Per size: forwarded prompt tokens (``X-Memory-Context-Tokens``), whether
the answer was forwarded (``/context``), gateway and Redis CPU per request (on-CPU time
of every thread from ``/proc/<pid>/task/*/schedstat`` over the requests / N), and the
time to the first SSE event through the gateway and straight to the upstream with the
same forwarded messages, interleaved (A B B A), the difference being the added latency.
The sizes take turns in blocks of 10 requests, so that the machine's drift reaches each
alike.
Beside it, the *full history* a client without the gateway would send: its tokens, its
bytes, the client's CPU to serialize and count it, and its time to first event straight
to the upstream. Ratios compare the largest size with the smallest (target: the added
p50 at most 1.3x, issue 33).

Part 1 runs in three conditions (``--conditions``), each on a Redis of its own data:
``flushed`` (the above: every job run before the requests, no worker in the process);
and two live ones, where users are: the in-process worker on and the imported sessions'
jobs left pending (never flushed; the requests' own turns add more), with a working
summarizer (``live-working``: the fake upstream's ``slow-summarizer``, a valid answer
after ``--summarizer-ms``) or a failing one (``live-failing``: the fast upstream's
``bench-summarizer``, whose "ok ok …" every summary rule refuses, so that the model-free
fallback runs at once in the gateway's process). In a live condition the gateway's CPU
per request includes its worker's, and the pending jobs are read at load and at the end.

Part 2, **time to first token while summaries are made**. A gateway with the in-process
worker and ``rolling-summary`` (a fold job every turn) whose summarizer answers after
``--summarizer-ms`` (the fake upstream's ``slow-summarizer``). Probes (streamed, on
their own sessions, ``X-Memory-Mode: read``) and direct calls run through four phases:
idle; writers sending turns in ``read`` mode (the same request load, no jobs); writers
recording turns (jobs enqueued faster than the worker drains them); and the backlog
draining with no writers. The ``mg:jobs`` stream is sampled every 100 ms: depth (not
yet delivered + delivered, not acknowledged) and lag (age of the oldest unfinished job).

    python bench/flat_cost.py --quick                # ~1.5 min
    python bench/flat_cost.py [--sizes 10,100,1000,10000] [--requests 200] [--json out.json]

Timings on a shared machine are indicative; ratios taken in one run are the numbers
to read. ``--json`` records the commit, the machine and the library versions with them.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._harness import (  # noqa: E402
    DIE_WITH_PARENT,
    SUMMARIZER_SERVER,
    commit,
    cpu_seconds,
    free_port,
    machine,
    stop,
    versions,
    wait_healthy,
)
from bench.conversations import DEFAULT_DEPTHS, Fact, generate, mentions  # noqa: E402
from devsupport.servers import RedisProcess  # noqa: E402
from gateway.auth.identity import tenant_id  # noqa: E402
from gateway.config import WorkerConfig  # noqa: E402
from gateway.memory.model import Message  # noqa: E402
from gateway.store.keys import JOB_GROUP, TENANT_SECRET_KEY, SessionKeys, job_stream  # noqa: E402
from gateway.text.tokens import TokenCounter  # noqa: E402

MODEL = "bench"  # fast_upstream: the first chunk at once, five chunks
API_KEY = "sk-bench-flat-cost"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
IMPORT_BATCH = 500  # messages per import request (the gateway's own batch)
# Requests of one size in a row before the next size's (see measure_sizes).
BLOCK = 10
WINDOW = 8  # hybrid-recall's window: facts older than this must come back through recall


# --- Processes -------------------------------------------------------------------------


@contextlib.contextmanager
def process(command: Sequence[str], ready: Callable[[], bool]) -> Iterator[int]:
    """A helper server that dies with the benchmark; its pid once ``ready()``."""
    with tempfile.TemporaryFile() as log:
        child = subprocess.Popen(
            [sys.executable, "-c", DIE_WITH_PARENT, *command],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while not ready():
                if child.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    output = log.read()[-2000:].decode()
                    raise RuntimeError(f"{command} did not start:\n{output}")
                time.sleep(0.05)
            yield child.pid
        finally:
            stop(child)


def _answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, timeout=1).status_code == 200
    return False


@contextlib.contextmanager
def fast_upstream() -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    script = str(ROOT / "bench" / "fast_upstream.py")
    with process([script, "--port", str(port)], lambda: _answers(f"{url}/models")):
        yield url


@contextlib.contextmanager
def summarizer_upstream(delay_s: float) -> Iterator[str]:
    """The test suite's fake upstream, for its summarizer models (valid summaries and facts;
    ``slow-summarizer``'s after ``delay_s``)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    command = ["-c", SUMMARIZER_SERVER, str(port), str(delay_s)]
    with process(command, lambda: _answers(f"{url}/models")):
        yield url


@dataclass(frozen=True)
class Gateway:
    url: str
    pid: int


@contextlib.contextmanager
def gateway(settings: dict[str, Any]) -> Iterator[Gateway]:
    """``memory-gateway serve`` with these settings (JSON is YAML) on a free port."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="mg-flat-") as workdir:
        config = Path(workdir) / "gateway.yaml"
        server = {"host": "127.0.0.1", "port": port, "log_level": "warning"}
        config.write_text(json.dumps({"server": server, **settings}))
        logpath = Path(workdir) / "gateway.log"
        with logpath.open("wb") as logfile:
            command = ["-m", "gateway.cli", "serve", "--config", str(config)]
            child = subprocess.Popen(
                [sys.executable, "-c", DIE_WITH_PARENT, *command],
                cwd=ROOT, stdout=logfile, stderr=subprocess.STDOUT,
            )  # fmt: skip
            base = f"http://127.0.0.1:{port}"
            try:
                wait_healthy(base, child, logpath)
                yield Gateway(base, child.pid)
            except Exception:
                log(f"gateway log:\n{logpath.read_text()[-3000:]}")
                raise
            finally:
                stop(child)


def gateway_settings(
    redis_url: str, upstream: str, summarizer: str, preset: str, *, summarizer_model: str,
    in_process_worker: bool,
) -> dict[str, Any]:  # fmt: skip
    return {
        "upstream": {"base_url": upstream},
        "redis": {"url": redis_url, "timeout_ms": 2000},
        "memory": {"preset": preset},
        "summarizer": {"base_url": summarizer, "model": summarizer_model, "timeout_s": 30},
        "worker": {"in_process": in_process_worker},
    }


# --- Timing one request ----------------------------------------------------------------


@dataclass(frozen=True)
class Timed:
    first_event_s: float
    total_s: float
    headers: httpx.Headers


def stream(client: httpx.Client, url: str, body: bytes, headers: dict[str, str]) -> Timed:
    """POST a streamed chat request; the time to its first body bytes and to its end."""
    start = time.perf_counter()
    with client.stream("POST", url, content=body, headers=headers) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"{url}: {response.status_code} {response.text[:300]}")
        chunks = response.iter_raw()
        next(chunks)
        first = time.perf_counter() - start
        for _ in chunks:
            pass
    return Timed(first, time.perf_counter() - start, response.headers)


def chat_body(messages: Sequence[dict[str, Any]], *, stream: bool = True) -> bytes:
    return json.dumps({"model": MODEL, "messages": list(messages), "stream": stream}).encode()


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(value: float) -> float:
    return round(value * 1000, 3)


# --- Part 1: cost against conversation length ------------------------------------------


@dataclass
class Session:
    id: str
    messages: tuple[dict[str, str], ...]
    facts: tuple[Fact, ...]  # stated outside the window: only recall brings them back


@functools.cache  # each condition of part 1 imports the same (10,000 messages take seconds)
def conversation(size: int, number: int, seed: int) -> Session:
    """``size`` messages of generated small talk with facts planted throughout.

    Short ones are the start of a conversation that states a fact in its first message.
    (Generating 10,000 messages takes seconds: every planted value is checked against
    every message, which is what makes each fact's answer unambiguous.)
    """
    if size < 100:
        made = generate(seed, number, 100, (0.0,))
    else:
        made = generate(seed, number, size, DEFAULT_DEPTHS)
    # A constraint's answer depends on which of its statements came last; other kinds
    # have one value each, so finding it in the context is unambiguous.
    facts = [f for f in made.facts if f.kind != "constraint" and f.index < size - WINDOW]
    return Session(f"flat-{size}-{number}", made.messages[:size], tuple(facts))


def copies(size: int, requests: int) -> int:
    """Sessions per size, so that the requests' own turns grow no session by much."""
    return max(1, min(requests, 2000 // size))


def post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    if response.status_code != 200:
        raise RuntimeError(f"{path}: {response.status_code} {response.text[:300]}")
    result: dict[str, Any] = response.json()
    return result


def import_session(client: httpx.Client, session: Session) -> None:
    path = f"/memory/sessions/{session.id}"
    for start in range(0, len(session.messages), IMPORT_BATCH):
        batch = session.messages[start : start + IMPORT_BATCH]
        post(client, f"{path}/messages", {"messages": batch})


def load_session(client: httpx.Client, session: Session) -> int:
    """Import, then run every summarizer job so the tiers are complete; the jobs run."""
    import_session(client, session)
    return flush_session(client, session)


def pending_jobs(client: httpx.Client, session_ids: Sequence[str]) -> int:
    """The sessions' summary jobs not run yet, as the memory API counts them."""
    return sum(
        int(post_get(client, f"/memory/sessions/{session_id}")["pending_jobs"])
        for session_id in session_ids
    )


def post_get(client: httpx.Client, path: str) -> dict[str, Any]:
    response = client.get(path)
    if response.status_code != 200:
        raise RuntimeError(f"{path}: {response.status_code} {response.text[:300]}")
    result: dict[str, Any] = response.json()
    return result


def flush_session(client: httpx.Client, session: Session) -> int:
    path = f"/memory/sessions/{session.id}"
    ran = 0
    for _ in range(50):
        flushed = post(client, f"{path}/flush", {})
        ran += flushed["ran"]
        if flushed["pending_jobs"] == 0:
            return ran
        time.sleep(0.2)
    raise RuntimeError(f"{session.id}: jobs still pending")


def probe(fact: Fact) -> dict[str, str]:
    return {"role": "user", "content": fact.probe}


def forwarded(client: httpx.Client, session: Session, fact: Fact) -> tuple[list[Any], bool]:
    """What the gateway forwards for this probe, and whether it holds the answer."""
    body = json.loads(chat_body([probe(fact)]))
    context = post(client, f"/memory/sessions/{session.id}/context", body)["messages"]
    text = " ".join(str(m.get("content") or "") for m in context[:-1])
    return context, mentions(text, fact.expected)


def stored_kb(store: redis.Redis, session_id: str) -> dict[str, float]:
    """Redis memory of the session's message log, recall index and tiers (one string:
    summaries, facts; read whole by every request)."""
    keys = SessionKeys(tenant_id(store.get(TENANT_SECRET_KEY) or b"", API_KEY), session_id)
    return {
        f"{name}_kb": (store.memory_usage(getattr(keys, name), samples=0) or 0) / 1024
        for name in ("log", "index", "tiers")
    }


def full_history_cost(counter: TokenCounter, session: Session, fact: Fact) -> dict[str, float]:
    """What a client without the gateway sends: every message, serialized and counted."""
    messages = [*session.messages, probe(fact)]
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        body = chat_body(messages)
        tokens = counter.count_prompt(Message.from_openai(m) for m in messages)
        best = min(best, time.process_time() - start)
    return {"tokens": tokens, "bytes": len(body), "cpu_ms": best * 1000}


@dataclass
class SizeRun:
    """One size's sessions and requests, and what its requests measured so far."""

    plan: list[tuple[Session, Fact]]  # the requests, in order
    contexts: dict[tuple[str, str], tuple[list[Any], bool]]  # what /context forwards
    loaded: dict[str, Any]  # import, flush and storage figures
    full: dict[str, float]
    full_body: bytes
    gw_first: list[float] = field(default_factory=list)
    direct_first: list[float] = field(default_factory=list)
    full_first: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    cpu_gw_s: float = 0.0
    cpu_redis_s: float = 0.0
    session_ids: tuple[str, ...] = ()


def prepare_size(
    client: httpx.Client, gw: Gateway, store: redis.Redis, size: int, requests: int, seed: int,
    *, flush: bool = True,
) -> SizeRun:  # fmt: skip
    """Sessions of ``size`` messages imported (and flushed, unless a live condition leaves
    their jobs to the worker), and the requests to send them."""
    sessions = [conversation(size, n, seed) for n in range(copies(size, requests))]
    started = time.monotonic()
    for session in sessions:
        import_session(client, session)
    jobs, job_cpu_ms = None, None
    if flush:  # the jobs' cost (summaries, facts), off the request path
        cpu = cpu_seconds(gw.pid)
        jobs = sum(flush_session(client, session) for session in sessions)
        job_cpu_ms = (cpu_seconds(gw.pid) - cpu) / jobs * 1000 if jobs else None
    loaded_s = time.monotonic() - started
    ids = tuple(session.id for session in sessions)
    plan = [(s, f) for s in sessions for f in s.facts]
    plan = [plan[i % len(plan)] for i in range(requests)]
    loaded = {
        "messages": size,
        "sessions": len(sessions),
        "requests": requests,
        "load_s": round(loaded_s, 1),
        "summary_jobs": jobs,
        "job_cpu_ms": job_cpu_ms,
        "pending_jobs_loaded": pending_jobs(client, ids),
        **stored_kb(store, sessions[0].id),
    }
    return SizeRun(
        plan, {(s.id, f.probe): forwarded(client, s, f) for s, f in plan}, loaded,
        full_history_cost(TokenCounter(), *plan[0]),
        chat_body([*plan[0][0].messages, probe(plan[0][1])]), session_ids=ids,
    )  # fmt: skip


def send(run: SizeRun, i: int, client: httpx.Client, direct: httpx.Client, url: str) -> None:
    """The run's ``i``-th request through the gateway and its context straight to the
    upstream, in turn (A B B A: neither path always runs on a warm cache)."""
    session, fact = run.plan[i]
    headers = {**AUTH, "X-Session-Id": session.id}
    context, _ = run.contexts[(session.id, fact.probe)]

    def through_gateway() -> None:
        timed = stream(client, "/v1/chat/completions", chat_body([probe(fact)]), headers)
        run.gw_first.append(timed.first_event_s)
        run.tokens.append(int(timed.headers["x-memory-context-tokens"]))

    def straight() -> None:
        run.direct_first.append(stream(direct, url, chat_body(context), AUTH).first_event_s)

    for step in (through_gateway, straight) if i % 2 else (straight, through_gateway):
        step()


def measure_sizes(
    runs: Sequence[SizeRun], client: httpx.Client, direct: httpx.Client, gw: Gateway,
    redis_pid: int, upstream: str,
) -> None:  # fmt: skip
    """Every size's requests, the sizes interleaved in blocks of ``BLOCK``.

    Sizes measured one after the other compared different machines: this machine's speed
    drifts by up to 2x within minutes, and the last size measured (the longest session)
    took all of the drift. In rotating blocks every size sees the same drift. CPU is
    read around each block (schedstat: ns, not ticks)."""
    url = f"{upstream}/chat/completions"
    for run in runs:
        # Warm-up (not counted, nothing recorded): pools, caches, the first stream's setup.
        for session, fact in run.plan[:5]:
            warm = {**AUTH, "X-Session-Id": session.id, "X-Memory-Mode": "read"}
            stream(client, "/v1/chat/completions", chat_body([probe(fact)]), warm)
            context = run.contexts[(session.id, fact.probe)][0]
            stream(direct, url, chat_body(context), AUTH)
    requests = max(len(run.plan) for run in runs)
    for block, start in enumerate(range(0, requests, BLOCK)):
        shift = block % len(runs)
        for run in [*runs[shift:], *runs[:shift]]:
            cpu_gw, cpu_redis = cpu_seconds(gw.pid), cpu_seconds(redis_pid)
            for i in range(start, min(start + BLOCK, len(run.plan))):
                send(run, i, client, direct, url)
            run.cpu_gw_s += cpu_seconds(gw.pid) - cpu_gw
            run.cpu_redis_s += cpu_seconds(redis_pid) - cpu_redis
    # The full history straight to the upstream, after the loop: the gateway's CPU above
    # is its own, and a 10,000-message body would not share the upstream with it. Also
    # interleaved, one request of each size in turn.
    for _ in range(max(3, requests // 4)):
        for run in runs:
            run.full_first.append(stream(direct, url, run.full_body, AUTH).first_event_s)


def size_row(run: SizeRun, pending_end: int) -> dict[str, Any]:
    gw_first, direct_first, requests = run.gw_first, run.direct_first, len(run.plan)
    present = [run.contexts[(s.id, f.probe)][1] for s, f in run.plan]
    return {
        **run.loaded,
        "pending_jobs_end": pending_end,
        "forwarded_tokens": statistics.mean(run.tokens),
        "recall_present": sum(present) / len(present),
        "gateway_cpu_ms": run.cpu_gw_s / requests * 1000,
        "redis_cpu_ms": run.cpu_redis_s / requests * 1000,
        "gateway_first_event_p50_ms": ms(statistics.median(gw_first)),
        "direct_first_event_p50_ms": ms(statistics.median(direct_first)),
        "added_p50_ms": ms(statistics.median(gw_first) - statistics.median(direct_first)),
        "added_p99_ms": ms(percentile(gw_first, 0.99) - percentile(direct_first, 0.99)),
        "full_history_tokens": run.full["tokens"],
        "full_history_bytes": run.full["bytes"],
        "full_history_client_cpu_ms": run.full["cpu_ms"],
        "full_history_first_event_p50_ms": ms(statistics.median(run.full_first)),
    }


RATIO_KEYS = (
    "tiers_kb",
    "forwarded_tokens", "gateway_cpu_ms", "redis_cpu_ms", "added_p50_ms", "added_p99_ms",
    "gateway_first_event_p50_ms", "full_history_tokens", "full_history_client_cpu_ms",
    "full_history_first_event_p50_ms", "job_cpu_ms",
)  # fmt: skip


def ratios(rows: Sequence[dict[str, Any]], base: int) -> dict[str, float | None]:
    """Each measure at the largest size over the same at ``rows[base]`` (None: either is
    missing, as the jobs' CPU of a live condition, or the base is 0)."""
    first, last = rows[base], rows[-1]
    return {
        key: (last[key] / first[key] if first[key] and last[key] is not None else None)
        for key in RATIO_KEYS
    }


RATIO_TARGET = 1.3  # issue 33: the largest session's added p50 over the smallest's


@dataclass(frozen=True)
class Condition:
    """What part 1's gateway runs beside the requests: its worker and its summarizer."""

    name: str
    summarizer: str  # "instant", "slow" (the fake upstream's) or "upstream" (the fast one)
    model: str
    live: bool  # the in-process worker on, the jobs never flushed


CONDITIONS = {
    "flushed": Condition("flushed", "instant", "fake-summarizer", live=False),
    "live-working": Condition("live-working", "slow", "slow-summarizer", live=True),
    "live-failing": Condition("live-failing", "upstream", "bench-summarizer", live=True),
}


def summary_outcomes(client: httpx.Client) -> dict[str, float]:
    """The gateway's summarizer answers so far by outcome (ok, rejected, failed, ...)."""
    prefix = "memory_gateway_summaries_total{outcome="
    return {
        line[len(prefix) :].split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in client.get("/metrics").text.splitlines()
        if line.startswith(prefix)
    }


def run_flat_cost(args: argparse.Namespace, redis_server: RedisProcess) -> dict[str, Any]:
    """Part 1 in each condition: ``{condition name: result}``."""
    results = {}
    with fast_upstream() as upstream, summarizer_upstream(0.0) as instant, \
            summarizer_upstream(args.summarizer_ms / 1000) as slow:  # fmt: skip
        summarizers = {"instant": instant, "slow": slow, "upstream": upstream}
        for name in args.conditions.split(","):
            condition = CONDITIONS[name]
            # Each on its own data: no session, and no job, of the one before.
            with redis_server.client() as store:
                store.flushall()
            log(f"  condition {name}")
            settings = gateway_settings(
                redis_server.url, upstream, summarizers[condition.summarizer], args.preset,
                summarizer_model=condition.model, in_process_worker=condition.live,
            )  # fmt: skip
            settings["memory"].update(json.loads(args.memory))
            results[name] = run_condition(args, redis_server, settings, upstream, condition)
    return results


def run_condition(
    args: argparse.Namespace, redis_server: RedisProcess, settings: dict[str, Any],
    upstream: str, condition: Condition,
) -> dict[str, Any]:  # fmt: skip
    sizes = [int(s) for s in args.sizes.split(",")]
    redis_pid = redis_server.process.pid if redis_server.process else 0
    with gateway(settings) as gw, redis_server.client() as store, \
            httpx.Client(base_url=gw.url, headers=AUTH, timeout=120) as client, \
            httpx.Client(timeout=120) as direct:  # fmt: skip
        runs = []
        for size in sizes:
            runs.append(
                prepare_size(
                    client, gw, store, size, args.requests, args.seed, flush=not condition.live
                )
            )
            log(f"  {size} messages loaded: {runs[-1].loaded}")
        measure_sizes(runs, client, direct, gw, redis_pid, upstream)
        rows = [size_row(run, pending_jobs(client, run.session_ids)) for run in runs]
        for row in rows:
            log(f"  {row['messages']} messages: {row}")
        outcomes = summary_outcomes(client)
    result = {
        "preset": args.preset,
        "condition": asdict(condition),
        "summaries": outcomes,
        "rows": rows,
        "ratio_last_first": ratios(rows, 0),
    }
    if len(rows) > 2:
        # The smallest session's whole history is smaller than the window and the
        # budget: from the second size on, the context is as full as it gets.
        result["ratio_last_second"] = ratios(rows, 1)
    return result


def flat_cost_table(result: dict[str, Any]) -> str:
    head = (
        "| messages | tiers / index / log KB | fwd tokens | recall present "
        "| gateway CPU ms/req | Redis CPU ms/req "
        "| added p50 ms | added p99 ms | gateway 1st event p50 ms | full-history tokens "
        "| full-history KB | full-history client CPU ms | full-history 1st event p50 ms "
        "| summary job CPU ms (flushed) or jobs pending at load → end (live) |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in result["rows"]:
        lines.append(
            f"| {r['messages']:,} "
            f"| {r['tiers_kb']:,.0f} / {r['index_kb']:,.0f} / {r['log_kb']:,.0f} "
            f"| {r['forwarded_tokens']:.0f} | {r['recall_present']:.0%} "
            f"| {r['gateway_cpu_ms']:.2f} | {r['redis_cpu_ms']:.3f} | {r['added_p50_ms']:.2f} "
            f"| {r['added_p99_ms']:.2f} | {r['gateway_first_event_p50_ms']:.2f} "
            f"| {r['full_history_tokens']:,} | {r['full_history_bytes'] / 1024:,.0f} "
            f"| {r['full_history_client_cpu_ms']:.2f} "
            f"| {r['full_history_first_event_p50_ms']:.2f} | {_job_cpu(r)} |"
        )
    for key in ("ratio_last_first", "ratio_last_second"):
        if key in result:
            lines.append(_ratio_row(result["rows"], key, result[key]))
    added = result["ratio_last_first"]["added_p50_ms"]
    met = "n/a" if added is None else ("yes" if added <= RATIO_TARGET else "no")
    sizes = f"{result['rows'][-1]['messages']:,} / {result['rows'][0]['messages']:,}"
    lines.append(
        f"\nAdded p50, {sizes} messages: "
        + ("n/a" if added is None else f"{added:.2f}x")
        + f" (target ≤ {RATIO_TARGET:g}x: {met}). Summarizer answers: "
        + (", ".join(f"{k} {v:.0f}" for k, v in result["summaries"].items() if v) or "none")
    )
    return "\n".join(lines)


def _job_cpu(row: dict[str, Any]) -> str:
    cpu = row["job_cpu_ms"]
    if row["summary_jobs"] is None:  # live: the worker ran them, or has yet to
        return f"{row['pending_jobs_loaded']:,} → {row['pending_jobs_end']:,}"
    return "n/a" if cpu is None else f"{cpu:.1f}"


def _ratio_row(rows: Sequence[dict[str, Any]], name: str, q: dict[str, float | None]) -> str:
    base = rows[0 if name == "ratio_last_first" else 1]["messages"]

    def x(key: str) -> str:
        return "n/a" if q[key] is None else f"{q[key]:.2f}x"

    return (
        f"| **{rows[-1]['messages']:,} / {base:,}** | {x('tiers_kb')} | {x('forwarded_tokens')} | "
        f"| {x('gateway_cpu_ms')} | {x('redis_cpu_ms')} | {x('added_p50_ms')} "
        f"| {x('added_p99_ms')} | {x('gateway_first_event_p50_ms')} "
        f"| {x('full_history_tokens')} | | {x('full_history_client_cpu_ms')} "
        f"| {x('full_history_first_event_p50_ms')} | {x('job_cpu_ms')} |"
    )


# --- Part 2: time to first token while summaries are made ------------------------------


@dataclass
class QueueSample:
    at: float
    depth: int  # notices not yet delivered + delivered and not acknowledged
    oldest_s: float  # age of the oldest unfinished job
    acked: int  # notices read and acknowledged so far


def sample_queue(client: redis.Redis) -> QueueSample:
    """The job stream's depth, oldest unfinished job and acknowledged notices, over its
    shards."""
    now = time.time()
    depth, acked, ages = 0, 0, []
    for shard in range(WorkerConfig().job_shards):
        stream = job_stream(shard)
        groups = client.xinfo_groups(stream) if client.exists(stream) else []
        group = next((g for g in groups if g["name"].decode() == JOB_GROUP), None)
        if group is None:
            continue
        pending = int(group["pending"])
        last = group["last-delivered-id"].decode()
        waiting = client.xrange(stream, min=f"({last}", count=10_000)
        oldest_ids = [entry_id for entry_id, _ in waiting[:1]]
        if pending:
            oldest_pending = client.xpending(stream, JOB_GROUP)["min"]
            if oldest_pending is not None:  # acknowledged since XINFO
                oldest_ids.append(oldest_pending)
        ages += [now - int(i.decode().split("-")[0]) / 1000 for i in oldest_ids]
        depth += len(waiting) + pending
        acked += int(group.get("entries-read") or 0) - pending
    return QueueSample(now, depth, max(ages, default=0.0), acked)


class QueueWatch:
    """Samples the job stream every ``every_s`` in a thread, until stopped."""

    def __init__(self, url: str, every_s: float = 0.1) -> None:
        self.client = redis.Redis.from_url(url)
        self.every_s = every_s
        self.samples: list[QueueSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(sample_queue(self.client))

    def __enter__(self) -> QueueWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()

    def between(self, start: float, end: float) -> list[QueueSample]:
        return [s for s in self.samples if start <= s.at <= end]


@dataclass
class Writers:
    """Threads sending turns (non-streamed) to their own sessions at a steady pace."""

    url: str
    count: int
    interval_s: float
    mode: str = "on"
    turns: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _run(self, number: int) -> None:
        headers = {**AUTH, "X-Session-Id": f"writer-{number}", "X-Memory-Mode": self.mode}
        with httpx.Client(base_url=self.url, timeout=60) as client:
            turn = 0
            while not self._stop.is_set():
                turn += 1
                text = f"Turn {turn}: my note number {turn} is about the garden and the budget."
                body = chat_body([{"role": "user", "content": text}], stream=False)
                try:
                    response = client.post("/v1/chat/completions", content=body, headers=headers)
                    if response.status_code != 200:
                        self.errors.append(f"{response.status_code} {response.text[:200]}")
                    self.turns += 1
                except httpx.HTTPError as error:
                    self.errors.append(repr(error))
                self._stop.wait(self.interval_s)

    def __enter__(self) -> Writers:
        for number in range(self.count):
            thread = threading.Thread(target=self._run, args=(number,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


PROBE_SESSIONS = 4


def probe_phase(
    client: httpx.Client, direct: httpx.Client, upstream: str, seconds: float,
    until: Callable[[], bool] = lambda: False,
) -> dict[str, list[float]]:  # fmt: skip
    """Probes every 20 ms for ``seconds`` (or until ``until()``): gateway and direct."""
    question = [{"role": "user", "content": "What is my booking reference?"}]
    body = chat_body(question)
    gw_first, direct_first = [], []
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline and not until():
        headers = {**AUTH, "X-Session-Id": f"probe-{i % PROBE_SESSIONS}", "X-Memory-Mode": "read"}

        def through_gateway(headers: dict[str, str] = headers) -> None:
            gw_first.append(stream(client, "/v1/chat/completions", body, headers).first_event_s)

        def straight() -> None:
            direct_first.append(
                stream(direct, f"{upstream}/chat/completions", body, AUTH).first_event_s
            )

        for step in (through_gateway, straight) if i % 2 else (straight, through_gateway):
            step()
        i += 1
        time.sleep(0.02)
    return {"gateway": gw_first, "direct": direct_first}


def summarize_phase(
    name: str, timings: dict[str, list[float]], queue: list[QueueSample], cpu_s: float,
    seconds: float, writers: Writers | None,
) -> dict[str, Any]:  # fmt: skip
    gw, direct = timings["gateway"], timings["direct"]
    depths = [s.depth for s in queue] or [0]
    acked = (queue[-1].acked - queue[0].acked) if len(queue) > 1 else 0
    return {
        "phase": name,
        "seconds": round(seconds, 1),
        "probes": len(gw),
        "gateway_ttft_p50_ms": ms(statistics.median(gw)),
        "gateway_ttft_p99_ms": ms(percentile(gw, 0.99)),
        "direct_ttft_p50_ms": ms(statistics.median(direct)),
        "added_p50_ms": ms(statistics.median(gw) - statistics.median(direct)),
        "added_p99_ms": ms(percentile(gw, 0.99) - percentile(direct, 0.99)),
        "writer_turns_per_s": round(writers.turns / seconds, 1) if writers else 0.0,
        "writer_errors": len(writers.errors) if writers else 0,
        "jobs_done_per_s": round(acked / seconds, 1),
        "queue_depth_mean": round(statistics.mean(depths), 1),
        "queue_depth_max": max(depths),
        "oldest_job_age_max_s": round(max((s.oldest_s for s in queue), default=0.0), 2),
        "gateway_cpu_percent": round(cpu_s / seconds * 100, 1),
    }


def preload(args: argparse.Namespace, redis_url: str, upstream: str) -> None:
    """Probe sessions, and the writers' earlier history, summarized at full speed by a
    gateway of their own (the measured one reads them from the same Redis, same tenant)."""
    with summarizer_upstream(0.0) as summarizer:
        settings = gateway_settings(
            redis_url, upstream, summarizer, args.summary_preset,
            summarizer_model="fake-summarizer", in_process_worker=False,
        )  # fmt: skip
        with gateway(settings) as gw, \
                httpx.Client(base_url=gw.url, headers=AUTH, timeout=120) as client:  # fmt: skip
            for n in range(PROBE_SESSIONS):
                load_session(client, replace(conversation(20, n, args.seed), id=f"probe-{n}"))
            for n in range(args.writers if args.writer_history else 0):
                history = conversation(args.writer_history, 100 + n, args.seed)
                load_session(client, replace(history, id=f"writer-{n}"))


@dataclass
class Phases:
    """Runs probe phases against one gateway and collects a row for each."""

    args: argparse.Namespace
    gw: Gateway
    upstream: str
    watch: QueueWatch
    client: httpx.Client
    direct: httpx.Client
    rows: list[dict[str, Any]]

    def run(self, name: str, mode: str | None, until: Callable[[], bool] | None = None) -> None:
        """A phase with writers in ``mode`` (None: no writers)."""
        pace = self.args.writers, self.args.writer_interval_ms / 1000
        writers = Writers(self.gw.url, *pace, mode=mode) if mode else None
        cpu, start = cpu_seconds(self.gw.pid), time.time()
        with writers or contextlib.nullcontext():
            timings = probe_phase(
                self.client, self.direct, self.upstream, self.args.phase_s,
                until or (lambda: False),
            )  # fmt: skip
        seconds = time.time() - start
        self.rows.append(summarize_phase(
            name, timings, self.watch.between(start, time.time()),
            cpu_seconds(self.gw.pid) - cpu, seconds, writers,
        ))  # fmt: skip
        log(f"  {self.rows[-1]}")

    def drained(self) -> bool:
        return bool(self.watch.samples) and self.watch.samples[-1].depth == 0


@contextlib.contextmanager
def phases_on(
    args: argparse.Namespace, settings: dict[str, Any], upstream: str, redis_url: str,
    rows: list[dict[str, Any]],
) -> Iterator[Phases]:  # fmt: skip
    with gateway(settings) as gw, QueueWatch(redis_url) as watch, \
            httpx.Client(base_url=gw.url, headers=AUTH, timeout=60) as client, \
            httpx.Client(timeout=60) as direct:  # fmt: skip
        probe_phase(client, direct, upstream, 0.5)  # warm-up, not counted
        yield Phases(args, gw, upstream, watch, client, direct, rows)


def run_summarization(args: argparse.Namespace, redis_server: RedisProcess) -> dict[str, Any]:
    redis_server.client().flushall()
    rows: list[dict[str, Any]] = []
    with fast_upstream() as upstream, summarizer_upstream(args.summarizer_ms / 1000) as summ:
        preload(args, redis_server.url, upstream)

        def settings(in_process_worker: bool) -> dict[str, Any]:
            return gateway_settings(
                redis_server.url, upstream, summ, args.summary_preset,
                summarizer_model="slow-summarizer", in_process_worker=in_process_worker,
            )  # fmt: skip

        with phases_on(args, settings(True), upstream, redis_server.url, rows) as phases:
            # Notices of the preloaded (and already flushed) jobs: gone through quickly.
            deadline = time.monotonic() + 120
            while not phases.drained() and time.monotonic() < deadline:
                time.sleep(0.1)
            phases.run("idle", None)
            phases.run("writers, read mode (no jobs)", "read")
            phases.run("writers recording (jobs made and run)", "on")
            phases.run("jobs draining, no writers", None, phases.drained)
        # The same recording load on a gateway that runs no jobs (as with a separate
        # `memory-gateway worker`): what is left is the recording's own cost.
        with phases_on(args, settings(False), upstream, redis_server.url, rows) as phases:
            phases.run("writers recording, no worker in the process", "on")
    return {
        "preset": args.summary_preset,
        "summarizer_ms": args.summarizer_ms,
        "writer_history": args.writer_history,
        "phases": rows,
    }


def summarization_table(result: dict[str, Any]) -> str:
    head = (
        "| phase | probes | gateway TTFT p50 / p99 ms | direct p50 ms | added p50 / p99 ms "
        "| writer turns/s | jobs done/s | queue depth mean / max | oldest job max s "
        "| gateway CPU % |"
    )
    lines = [head, "|" + "---|" * 10]
    for p in result["phases"]:
        lines.append(
            f"| {p['phase']} | {p['probes']} "
            f"| {p['gateway_ttft_p50_ms']:.2f} / {p['gateway_ttft_p99_ms']:.2f} "
            f"| {p['direct_ttft_p50_ms']:.2f} | {p['added_p50_ms']:.2f} / {p['added_p99_ms']:.2f} "
            f"| {p['writer_turns_per_s']} | {p['jobs_done_per_s']} "
            f"| {p['queue_depth_mean']} / {p['queue_depth_max']} | {p['oldest_job_age_max_s']} "
            f"| {p['gateway_cpu_percent']} |"
        )
    return "\n".join(lines)


# --- Main ------------------------------------------------------------------------------


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,100,1000,10000", help="messages per session")
    parser.add_argument("--requests", type=int, default=200, help="requests per size")
    parser.add_argument("--preset", default="hybrid-recall", help="part 1's preset")
    parser.add_argument(
        "--memory", default="{}", help='part 1: JSON merged into the memory settings, e.g. '
        '\'{"budget_tokens": 2000}\' or a "tiers" composition to try a change')  # fmt: skip
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--summarizer-ms", type=float, default=200, help="per summarizer call")
    parser.add_argument("--writers", type=int, default=4, help="part 2's writing sessions")
    parser.add_argument("--writer-interval-ms", type=float, default=50)
    parser.add_argument(
        "--writer-history",
        type=int,
        default=0,
        help="part 2: messages in each writer's session before it starts",
    )
    parser.add_argument("--summary-preset", default="rolling-summary", help="part 2's preset")
    parser.add_argument("--phase-s", type=float, default=10, help="seconds per part 2 phase")
    parser.add_argument("--parts", default="cost,summaries", help="cost, summaries or both")
    parser.add_argument(
        "--conditions",
        default=",".join(CONDITIONS),
        help=f"part 1's conditions, of {', '.join(CONDITIONS)}",
    )
    parser.add_argument("--quick", action="store_true",
                        help="sizes up to 5,000, 30 requests, 3 s phases: ~1.5 min")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write every number here")
    args = parser.parse_args(argv)
    unknown = set(args.conditions.split(",")) - set(CONDITIONS)
    if unknown:
        parser.error(f"--conditions: unknown {', '.join(sorted(unknown))}")
    if args.quick:
        # Making 10,000 messages' summaries alone takes ~40 s (see job_cpu_ms).
        args.sizes, args.requests, args.phase_s = "10,100,1000,5000", 30, 3.0
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    parts = args.parts.split(",")
    results: dict[str, Any] = {"commit": commit(), "machine": machine(), "versions": versions()}
    redis_server = RedisProcess().start()
    try:
        if "cost" in parts:
            log(
                f"part 1: {args.requests} requests at each of {args.sizes} messages, "
                f"conditions {args.conditions}"
            )
            results["flat_cost"] = run_flat_cost(args, redis_server)
        if "summaries" in parts:
            log(f"part 2: {args.phase_s} s phases, summarizer {args.summarizer_ms} ms a call")
            results["summarization"] = run_summarization(args, redis_server)
    finally:
        redis_server.cleanup()
    for name, result in results.get("flat_cost", {}).items():
        print(f"\n### Cost per request against conversation length ({args.preset}, {name})\n")
        print(flat_cost_table(result))
    if "summarization" in results:
        summaries = results["summarization"]
        print(
            f"\n### Time to first token while summaries are made ({summaries['preset']}, "
            f"writers' sessions {summaries['writer_history']:,} messages long)\n"
        )
        print(summarization_table(results["summarization"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
