"""Bounded under abuse (issue 22): what one abusive client does to everyone else.

For each attack, well-behaved clients of another tenant (the *victims*: small streamed
chat requests with ``X-Session-Id``, a few clients each on a fixed schedule) run for a
fixed period against a gateway under that attack, and with no attack (the *baseline*,
first and last) in the same run. One markdown table: the victims' requests, p50/p99,
errors, p99 against the baselines', the gateway's peak RSS, how the attacker was answered.

Every party is its own process: a private redis-server, ``bench/fast_upstream.py`` (whose
``abuse-*`` models give the huge, gzip-bomb and endless answers), the victims and the
attacker (``bench/abuse_clients.py``), and a fresh ``memory-gateway serve`` for each
scenario (so that its peak RSS, ``VmHWM``, and its state belong to that scenario alone).
The attacker uses its own API key (another tenant in forward mode) and connects from
127.0.0.2, the victims from 127.0.0.1: a limit per client address or per tenant may stop
the attacker without touching the victims. bench/README.md describes every scenario.

    .venv/bin/python bench/abuse.py --quick                     # 2.5 s phases, ~70-95 s
    .venv/bin/python bench/abuse.py                             # 10 s phases, ~3.5 min
    .venv/bin/python bench/abuse.py --scenarios gzip-bomb,flood --no-limits --json out.json

Victim latency is the time from when a request was *due* (each client sends one every
1 / ``--victim-rate`` s) to its last byte, so a stall counts for every request it
delayed, not only the one it caught (no coordinated omission). An error is any answer
that is not a 200 stream ending in ``[DONE]`` with ``X-Memory-Status: ok`` (a timeout,
a 4xx/5xx, an in-band error event, ``degraded``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._harness import commit, free_port, quantile, rss_kib, table  # noqa: E402
from bench.abuse_clients import VICTIM_MODEL, raise_nofile  # noqa: E402
from devsupport.servers import RedisProcess  # noqa: E402

PYTHON = sys.executable
CLIENTS = ROOT / "bench" / "abuse_clients.py"
SUMMARIZER_MODEL = "bench-summarizer"
GATEWAY_NOFILE = 1024  # a common default soft limit (systemd, many containers)
MIB = 1024 * 1024
RSS_LIMIT_MIB = 1024  # the bound on the gateway's RSS
P99_FACTOR = 3.0  # the issue's bound on the victims' p99 against the baseline
# limits.tenant when the gateway has a limits section: above what the victims use in one
# scenario (at most ~430 requests, 4 in flight, ~3,000 tokens each: they are a fresh
# tenant's first minute), far below what a flood or a huge payload in a loop uses.
LIMITS = {"requests_per_minute": 600, "tokens_per_minute": 5_000_000, "concurrent": 16}


# --- Plans and scenarios ------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    victims_s: float  # victims' timed period per scenario
    victim_timeout_s: float  # a victim request slower than this is an error
    ramp_s: float  # attack running before the victims' period starts
    abandon_s: float  # the endless stream is read this long, then dropped
    warmup: int  # victim requests sent (untimed) to a fresh gateway before anything else


FULL = Plan(victims_s=10.0, victim_timeout_s=10.0, ramp_s=1.0, abandon_s=5.0, warmup=30)
QUICK = Plan(victims_s=2.5, victim_timeout_s=4.0, ramp_s=0.3, abandon_s=2.0, warmup=10)


@dataclass(frozen=True)
class Scenario:
    name: str  # for --scenarios
    label: str  # the table's first column
    attack: str | None  # the attacker's kind (abuse_clients.ATTACKS), None: no attack
    params: dict[str, Any] = field(default_factory=dict)


def accepted_message_bytes() -> int:
    """A little under the largest message text a default gateway accepts."""
    from gateway.config import ServerConfig

    server = ServerConfig()
    body = server.max_body_bytes - 64 * 1024  # room for the request's JSON around it
    return min(body, getattr(server, "max_message_bytes", body)) - 1024


def scenarios() -> tuple[Scenario, ...]:
    accepted = accepted_message_bytes()
    words = min(455_000, accepted // 5)  # four letters and a space each
    return (
        Scenario("big-message", "one 4 MiB message of random letters, 1 client in a loop",
                 "big", {"clients": 1, "size": 4 * MIB - 1024}),
        Scenario("big-message-x2", "one 4 MiB message of random letters, 2 clients in a loop",
                 "big", {"clients": 2, "size": 4 * MIB - 1024}),
        Scenario("big-accepted", f"one {accepted / MIB:.2f} MiB message of random letters "
                 "(the largest accepted), 2 clients in a loop", "big",
                 {"clients": 2, "size": accepted}),
        Scenario("many-messages", "100,000 tiny messages in one body, in a loop", "many"),
        Scenario("png-text-chunks", "a 19 KB PNG of zTXt chunks (18 MiB inflated; a body "
                 "under 32 KiB, read on the event loop), 2 clients in a loop", "png",
                 {"clients": 2, "images": 1, "chunks": 18}),
        Scenario("png-text-chunks-pool", "100 PNGs of 24 zTXt chunks in one 3.4 MB body "
                 "(the heavy-work pool's), 2 clients in a loop", "png",
                 {"clients": 2, "images": 100, "chunks": 24}),
        Scenario("unread-streams", "520 streams never read (client stops reading)", "unread",
                 {"connections": 520}),
        Scenario("unread-streams-3-addresses", "750 trickling streams (1 KiB every 0.7 s) "
                 "never read, from 3 addresses (250 each, under the per-address cap)",
                 "unread", {"connections": 750, "addresses": 3, "model": "abuse-endless-s700"}),
        Scenario("slow-connections", "1,100 slow-header / slow-body / idle connections",
                 "slow", {"connections": 1100}),
        Scenario("huge-stream", "100 MB upstream answer, streamed, in a loop", "upstream",
                 {"model": "abuse-huge", "stream": True}),
        Scenario("huge-json", "100 MB upstream answer, not streamed, in a loop", "upstream",
                 {"model": "abuse-huge", "stream": False}),
        Scenario("gzip-bomb", "gzip bomb (51 KB -> 52 MB), in a loop", "upstream",
                 {"model": "abuse-gzip-bomb", "stream": False}),
        Scenario("endless-abandoned", "endless stream dropped by its client after a few s, "
                 "in a loop", "upstream", {"model": "abuse-endless", "stream": True,
                                           "abandon": True}),
        Scenario("distinct-words", "one message of 455,000 distinct words, in a loop", "words",
                 {"words": 455_000}),
        Scenario("distinct-words-accepted", f"one message of {words:,} distinct words (the "
                 "largest accepted), in a loop", "words", {"words": words}),
        Scenario("flood", "flood from one tenant (300 req/s, 64 in flight)", "flood",
                 {"rate": 300, "in_flight": 64}),
    )  # fmt: skip


BASELINE = Scenario("baseline", "baseline (no attack)", None)
BASELINE_END = Scenario("baseline-end", "baseline again, at the end", None)


# --- Processes ----------------------------------------------------------------------------


# Runs a child that dies with the benchmark (Linux's PR_SET_PDEATHSIG survives the exec)
# under a soft RLIMIT_NOFILE of argv[1] (0: as inherited).
_EXEC = """
import ctypes, os, resource, signal, sys
try:
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)
except OSError:
    pass
soft = int(sys.argv[1])
if soft > 0:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = soft if hard == resource.RLIM_INFINITY else min(soft, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def spawn(
    args: Sequence[str], log: Path, *, nofile: int = 0, **popen: Any
) -> subprocess.Popen[bytes]:
    """A Python child in its own process group, dying with the bench; output to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [PYTHON, "-c", _EXEC, str(nofile), *args],
            cwd=ROOT, stdout=popen.pop("stdout", out), stderr=out, start_new_session=True,
            **popen,
        )  # fmt: skip


def stop(child: subprocess.Popen[bytes], grace_s: float = 1.0) -> None:
    """SIGTERM to the child's group, SIGKILL after ``grace_s``: nothing outlives its phase."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        if child.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(wait_s)


def wait_until_answers(
    url: str, child: subprocess.Popen[bytes], log: Path, wait_s: float = 60
) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        if child.poll() is not None:
            raise RuntimeError(f"{url}: the process exited:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code < 500:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}: no answer after {wait_s:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


@contextlib.contextmanager
def fast_upstream(work: Path) -> Iterator[str]:
    port = free_port()
    log = work / "upstream.log"
    child = spawn([str(ROOT / "bench" / "fast_upstream.py"), "--port", str(port)], log)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_answers(url + "/models", child, log)
        yield url
    finally:
        stop(child)


def limits_settings(enabled: bool) -> dict[str, Any] | None:
    """The ``limits`` section the bench sets, if enabled and this gateway has one."""
    from gateway.config import RateLimit, Settings

    if not enabled or "limits" not in Settings.model_fields:
        return None
    return {"tenant": {k: v for k, v in LIMITS.items() if k in RateLimit.model_fields}}


def gateway_settings(upstream: str, redis_url: str, port: int, limits: bool) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning"},
        "upstream": {"base_url": upstream},
        "redis": {"url": redis_url},
        "summarizer": {"model": SUMMARIZER_MODEL},
        # The request path only: summaries would add the worker's CPU to every phase.
        "worker": {"in_process": False},
    }
    section = limits_settings(limits)
    if section is not None:
        settings["limits"] = section
    return settings


@dataclass(frozen=True)
class Gateway:
    url: str  # http://127.0.0.1:port
    port: int
    pid: int


@contextlib.contextmanager
def gateway(
    work: Path, name: str, port: int, settings: dict[str, Any], nofile: int
) -> Iterator[Gateway]:
    """A fresh ``memory-gateway serve`` under a soft descriptor limit of ``nofile``."""
    config = work / f"gateway-{name}.yaml"
    config.write_text(json.dumps(settings))  # JSON is YAML
    log = work / f"gateway-{name}.log"
    child = spawn(["-m", "gateway.cli", "serve", "--config", str(config)], log, nofile=nofile)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_answers(url + "/healthz", child, log)
        yield Gateway(url, port, child.pid)
    finally:
        stop(child)


class Client:
    """A victims' or an attacker's process (``bench/abuse_clients.py``), driven by lines."""

    def __init__(self, role: str, job: dict[str, Any], log: Path) -> None:
        self.log = log
        self.child = spawn(
            [str(CLIENTS), "--role", role], log, stdout=subprocess.PIPE, stdin=subprocess.PIPE
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.send(json.dumps(job))

    def _read(self) -> None:
        assert self.child.stdout is not None
        for line in self.child.stdout:
            self.lines.put(line.decode().strip())
        self.lines.put(None)

    def send(self, line: str) -> None:
        assert self.child.stdin is not None
        with contextlib.suppress(OSError):
            self.child.stdin.write(line.encode() + b"\n")
            self.child.stdin.flush()

    def expect(self, prefix: str, timeout_s: float) -> str | None:
        """The next line starting with ``prefix``; None if the process ended or took longer."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith(prefix):
                return line
        return None

    def result(self, timeout_s: float) -> dict[str, Any]:
        line = self.expect("{", timeout_s)
        if line is None:
            self.close()
            return {"failed": f"no result in {timeout_s:.0f} s: {self.log_tail()}"}
        result: dict[str, Any] = json.loads(line)
        return result

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text()[-600:].strip().replace("\n", " | ")
        return ""

    def close(self) -> None:
        stop(self.child)


# --- Measuring the gateway process --------------------------------------------------------


def status_kib(pid: int, field_name: str) -> int:
    """A ``/proc/<pid>/status`` size in KiB (``VmHWM``: the peak RSS of the process)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def open_fds(pid: int) -> int:
    with contextlib.suppress(OSError):
        return len(os.listdir(f"/proc/{pid}/fd"))
    return 0


class Sampler:
    """VmRSS and open descriptors of a process, sampled every 50 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss_kib = rss_kib(pid)
        self.fds = open_fds(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(OSError):
                self.rss_kib = max(self.rss_kib, rss_kib(self.pid))
            self.fds = max(self.fds, open_fds(self.pid))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- One scenario -------------------------------------------------------------------------


@dataclass
class Result:
    scenario: str
    label: str
    requests: int
    p50_ms: float
    p99_ms: float
    errors: dict[str, int]
    rss_peak_mib: float  # VmHWM of this scenario's gateway process
    rss_sampled_mib: float  # the largest VmRSS seen every 50 ms
    fds_peak: int
    attack: dict[str, Any]
    after_ms: float | None  # one victim request once the attack has stopped
    steps_s: dict[str, float]
    latencies_ms: list[float] = field(default_factory=list)  # the victims' answers
    ratio: float | None = None  # p99 / the baselines' p99


def warm_up(gw: Gateway, key: str, n: int) -> None:
    """A fresh gateway's first requests pay its one-time costs; the victims' do not."""
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
        for i in range(n):
            with contextlib.suppress(httpx.HTTPError):  # the victims will see it too
                http.post(
                    gw.url + "/v1/chat/completions",
                    headers={"X-Session-Id": f"warmup-{i % 4}"},
                    json={
                        "model": VICTIM_MODEL,
                        "messages": [{"role": "user", "content": f"hello number {i}"}],
                        "stream": True,
                    },
                )


def after_attack(gw: Gateway, key: str, timeout_s: float) -> float | None:
    """How long a victim's request takes once the attacker is gone (None: it failed)."""
    started = time.perf_counter()
    with contextlib.suppress(httpx.HTTPError):
        response = httpx.post(
            gw.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}", "X-Session-Id": "after"},
            json={
                "model": VICTIM_MODEL,
                "messages": [{"role": "user", "content": "are you back?"}],
                "stream": True,
            },
            timeout=timeout_s,
        )
        if response.status_code == 200:
            return (time.perf_counter() - started) * 1000
    return None


@dataclass(frozen=True)
class Run:
    """What every scenario of a run shares."""

    args: argparse.Namespace
    plan: Plan
    work: Path
    upstream: str
    redis: RedisProcess
    keys: dict[str, str]
    texts: list[str]  # the victims' user messages


def jobs(run: Run, scenario: Scenario, port: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The victims' job and the attacker's."""
    victims = {
        "url": f"http://127.0.0.1:{port}/v1/chat/completions",
        "key": run.keys["victim"],
        "clients": run.args.victims,
        "rate": run.args.victim_rate,
        "duration_s": run.plan.victims_s,
        "timeout_s": run.plan.victim_timeout_s,
        "sessions": f"victim-{scenario.name}-{uuid.uuid4().hex[:6]}",
        "texts": run.texts,
    }
    params = dict(scenario.params)
    if params.pop("abandon", False):
        params["abandon_s"] = run.plan.abandon_s
    attack = {
        "attack": scenario.attack,
        "host": "127.0.0.1",  # the attacker connects from abuse_clients.ATTACKER_ADDRESS
        "port": port,
        "key": run.keys["attacker"],
        "params": params,
    }
    return victims, attack


def attack_on(attacker: Client, ramp_s: float) -> dict[str, Any]:
    """Starts the attack; what went wrong, if anything."""
    failed: dict[str, Any] = {}
    if attacker.expect("prepared", 60) is None:
        failed["failed"] = f"attacker not prepared: {attacker.log_tail()}"
    attacker.send("go")
    if attacker.expect("ready", 60) is None and not failed:
        failed["failed"] = f"attacker not ready: {attacker.log_tail()}"
    time.sleep(ramp_s)
    return failed


def victims_period(victims: Client, plan: Plan) -> dict[str, Any]:
    if victims.expect("prepared", 60) is None:
        return {"failed": f"victims not prepared: {victims.log_tail()}"}
    victims.send("go")
    return victims.result(plan.victims_s + plan.victim_timeout_s + 30)


class Steps:
    """Seconds each step of a scenario took (the run's length is mostly these)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic()

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = round(now - self._last, 2)
        self._last = now


def measure(run: Run, scenario: Scenario) -> Result:
    """A fresh gateway; warm-up; the attack on; the victims' period; the attack off."""
    steps = Steps()
    client = run.redis.client()
    client.flushall()  # every scenario starts from the same empty store
    client.close()
    port = free_port()
    victim_job, attack_job = jobs(run, scenario, port)
    # Started first: their imports and payloads are made while the gateway starts.
    victims = Client("victims", victim_job, run.work / f"victims-{scenario.name}.log")
    attacker = None
    if scenario.attack is not None:
        attacker = Client("attack", attack_job, run.work / f"attack-{scenario.name}.log")
    attack: dict[str, Any] = {}
    settings = gateway_settings(run.upstream, run.redis.url, port, not run.args.no_limits)
    try:
        with gateway(run.work, scenario.name, port, settings, run.args.gateway_nofile) as gw:
            steps.done("gateway start")
            warm_up(gw, run.keys["victim"], run.plan.warmup)
            steps.done("warm-up")
            with Sampler(gw.pid) as sampler:
                if attacker is not None:
                    attack = attack_on(attacker, run.plan.ramp_s)
                    steps.done("attack on")
                measured = victims_period(victims, run.plan)
                steps.done("victims")
                if attacker is not None:
                    attacker.send("stop")
                    attack = {**attacker.result(30), **attack}
                    steps.done("attack off")
                after = after_attack(gw, run.keys["victim"], run.plan.victim_timeout_s)
            hwm = status_kib(gw.pid, "VmHWM")
    finally:
        victims.close()
        if attacker is not None:
            attacker.close()
    steps.done("stop")
    latencies: list[float] = measured.get("latencies_s", [])
    errors = dict(measured.get("errors", {}))
    if "failed" in measured:
        errors["victims failed"] = 1
        log(measured["failed"])
    return Result(
        scenario=scenario.name,
        label=scenario.label,
        requests=int(measured.get("requests", 0)),
        p50_ms=quantile(latencies, 0.5) * 1000,
        p99_ms=quantile(latencies, 0.99) * 1000,
        errors=errors,
        rss_peak_mib=max(hwm, sampler.rss_kib) / 1024,
        rss_sampled_mib=sampler.rss_kib / 1024,
        fds_peak=sampler.fds,
        attack=attack,
        after_ms=after,
        steps_s=steps.seconds,
        latencies_ms=[round(seconds * 1000, 2) for seconds in latencies],
    )


def failed(scenario: Scenario, why: str) -> Result:
    nan = math.nan
    first = why.splitlines()[0][:120]
    return Result(scenario.name, scenario.label, 0, nan, nan, {"not run": 1}, 0.0, 0.0, 0,
                  {"failed": first}, None, {})  # fmt: skip


# --- The table ----------------------------------------------------------------------------


def outcome_text(attack: dict[str, Any]) -> str:
    """How the attacker was answered, most frequent first."""
    if "failed" in attack:
        return "attack failed: " + str(attack["failed"]).splitlines()[0][:120]
    if "outcomes" not in attack:
        return "-"
    ordered = sorted(attack["outcomes"].items(), key=lambda item: -item[1])
    text = "; ".join(f"{label} x{count}" for label, count in ordered[:6]) or "no answer"
    if len(ordered) > 6:
        text += f"; {len(ordered) - 6} more kinds"
    notes = attack.get("notes", {})
    if "sent req/s" in notes:
        text += f" ({notes['sent req/s']} req/s sent)"
    if attack.get("mean_dropped_mb"):
        text += f" ({attack['mean_dropped_mb']:.0f} MB read before dropping, mean)"
    if notes.get("connect failures"):
        text += f"; connect failures {sum(notes['connect failures'].values())}"
    return text


def errors_text(errors: dict[str, int]) -> str:
    total = sum(errors.values())
    if not total:
        return "0"
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(errors.items(), key=lambda i: -i[1])[:3])
    return f"{total} ({kinds})"


def met(result: Result) -> str:
    ok = (
        not result.errors
        and result.ratio is not None
        and result.ratio <= P99_FACTOR
        and result.rss_peak_mib < RSS_LIMIT_MIB
    )
    return "yes" if ok else "no"


def markdown(results: Sequence[Result]) -> str:
    header = (
        "scenario",
        "victim requests",
        "p50 ms",
        "p99 ms",
        "errors",
        "p99 / baseline p99",
        "gateway peak RSS MiB",
        "attack outcome",
        f"met (p99 ≤ {P99_FACTOR:.0f}x, 0 errors, RSS < 1 GiB)",
    )
    rows = [
        (
            r.label,
            r.requests,
            "-" if math.isnan(r.p50_ms) else f"{r.p50_ms:.1f}",
            "-" if math.isnan(r.p99_ms) else f"{r.p99_ms:.1f}",
            errors_text(r.errors),
            "-" if r.ratio is None else f"{r.ratio:.1f}x",
            f"{r.rss_peak_mib:.0f}",
            outcome_text(r.attack),
            met(r) if r.attack else "",
        )
        for r in results
    ]
    return table(header, rows)


def run_all(
    args: argparse.Namespace, plan: Plan, chosen: Sequence[Scenario], work: Path
) -> list[Result]:
    from bench.load import TEXTS  # bench/conversations.py's user messages

    keys = {
        "victim": "sk-victim-" + uuid.uuid4().hex,
        "attacker": "sk-attacker-" + uuid.uuid4().hex,
    }
    results: list[Result] = []
    redis_server = RedisProcess().start()
    try:
        with fast_upstream(work) as upstream:
            run = Run(args, plan, work, upstream, redis_server, keys, list(TEXTS[:200]))
            for scenario in (BASELINE, *chosen, BASELINE_END):
                started = time.monotonic()
                try:
                    result = measure(run, scenario)
                except RuntimeError as error:  # the gateway did not start: the next may
                    log(f"{scenario.name}: {error}")
                    result = failed(scenario, str(error))
                results.append(result)
                log(
                    f"{scenario.name}: {result.requests} requests, p99 {result.p99_ms:.1f} ms, "
                    f"errors {errors_text(result.errors)}, RSS {result.rss_peak_mib:.0f} MiB, "
                    f"{outcome_text(result.attack)} ({time.monotonic() - started:.1f} s: "
                    f"{result.steps_s})"
                )
    finally:
        redis_server.cleanup()
    base = baseline_p99_ms(results)
    for result in results:
        if not math.isnan(result.p99_ms) and base and not math.isnan(base):
            result.ratio = result.p99_ms / base
    return results


def baseline_p99_ms(results: Sequence[Result]) -> float:
    """The p99 of both baselines' requests together: one baseline's p99 is its second
    slowest answer with ``--quick``, and one hiccup would move every ratio."""
    pooled = [
        ms for r in results if r.scenario in (BASELINE.name, BASELINE_END.name)
        for ms in r.latencies_ms
    ]  # fmt: skip
    return quantile(pooled, 0.99)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    names = [s.name for s in scenarios()]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2.5 s phases")
    parser.add_argument(
        "--scenarios", default=",".join(names), help="comma-separated, of: " + ", ".join(names)
    )
    parser.add_argument("--victims", type=int, default=4, help="victim clients")
    parser.add_argument("--victim-rate", type=float, default=10.0, help="requests/s per victim")
    parser.add_argument(
        "--gateway-nofile",
        type=int,
        default=GATEWAY_NOFILE,
        help="the gateway's soft descriptor limit (0: the bench's own)",
    )
    parser.add_argument(
        "--no-limits", action="store_true", help="leave the gateway's limits section off"
    )
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    by_name = {s.name: s for s in scenarios()}
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        log(f"unknown scenarios: {', '.join(unknown)}; known: {', '.join(by_name)}")
        return 2
    plan = QUICK if args.quick else FULL
    nofile = raise_nofile()
    work = Path(tempfile.mkdtemp(prefix="mg-abuse-"))
    started = time.monotonic()
    try:
        results = run_all(args, plan, [by_name[n] for n in names], work)
    except BaseException:
        log(f"logs kept in {work}")
        raise
    settings = {
        "commit": commit(),
        "plan": asdict(plan),
        "victims": f"{args.victims} clients x {args.victim_rate:g} req/s, streamed, "
        f"X-Session-Id over 16 sessions, model {VICTIM_MODEL}",
        "gateway": "memory-gateway serve, fresh per scenario, external Redis, worker off, "
        f"soft RLIMIT_NOFILE {args.gateway_nofile or nofile}",
        "limits": limits_settings(not args.no_limits) or "off",
        "bench RLIMIT_NOFILE soft": nofile,
        "cpus": os.cpu_count(),
        "wall_s": round(time.monotonic() - started, 1),
    }
    if args.keep_logs:
        settings["logs"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    settings["baseline p99 ms (both baselines' requests)"] = round(baseline_p99_ms(results), 1)
    print(markdown(results))
    print(f"\n{json.dumps(settings)}")
    if args.json:
        raw = {"settings": settings, "results": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(raw, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
