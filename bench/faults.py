"""The reliability report: faults injected into a real stack, what the gateway did about them.

Everything is real and local: redis-server processes (a private one per scenario that
breaks Redis), a TCP proxy for slow and black-holed Redis, the fake upstream on a real
socket, the gateway under uvicorn, clients over HTTP. The fault suite under ``tests/``
asserts the same properties; this script measures them in one run and prints one table
(markdown), the one in docs/benchmarks.md.

    .venv/bin/python bench/faults.py            # about a minute
    .venv/bin/python bench/faults.py --quick    # fewer runs, about 20 s
    .venv/bin/python bench/faults.py --json out.json

Times are wall-clock on whatever machine runs it: read them against the deadline they
must meet (``redis.timeout_ms`` is 100 ms here, its default), not as absolutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from devsupport.disconnects import measure_disconnects  # noqa: E402
from devsupport.fake_upstream import FakeUpstream  # noqa: E402
from devsupport.gateways import build_settings, start_gateway  # noqa: E402
from devsupport.invariants import (  # noqa: E402
    numbering_problems,
    once_problems,
    pairing_problems,
)
from devsupport.load import (  # noqa: E402
    Load,
    acknowledged,
    acknowledged_but_not_stored_once,
    ask,
    gateway_client,
)
from devsupport.servers import RedisProcess, ServerThread, running_redis  # noqa: E402
from devsupport.stored import stored_log  # noqa: E402
from devsupport.tcp_proxy import proxy_to  # noqa: E402

DEADLINE_MS = 100


@dataclass(frozen=True)
class Row:
    area: str
    scenario: str
    measured: str
    target: str
    met: bool


@dataclass
class Stack:
    """The fake upstream every scenario shares, and a way to start gateways in front of it."""

    fake: FakeUpstream
    upstream: ServerThread

    @contextlib.contextmanager
    def gateway(self, redis_url: str, **overrides: Any) -> Iterator[ServerThread]:
        settings = build_settings(self.upstream.url + "/v1", redis_url, **overrides)
        thread = start_gateway(settings)
        try:
            yield thread
        finally:
            thread.stop()


def new_key() -> str:
    return "sk-bench-" + secrets.token_urlsafe(24)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def quantiles(timings: list[float]) -> tuple[float, float]:
    """Median and nearest-rank p99."""
    ordered = sorted(timings)
    return statistics.median(ordered), ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


# --- Redis faults -------------------------------------------------------------------------


def redis_degrades(stack: Stack, runs: int) -> list[Row]:
    """Fail-open answers degraded within the deadline; fail-closed refuses; both resume."""
    rows = []
    budget = DEADLINE_MS / 1000 + 0.1  # the deadline plus the upstream round trip, roughly
    # AOF: a stopped Redis comes back with what it held (the question asked after a fault).
    with running_redis(appendonly=True) as redis_server, proxy_to(redis_server.port) as proxy:
        faults: dict[str, Callable[[bool], None]] = {
            "refused (Redis stopped)": lambda on: (
                redis_server.stop() if on else redis_server.start()
            ),
            "black-holed (accepts, never answers)": lambda on: setattr(proxy, "black_hole", on),
            "slow (every reply 500 ms late)": lambda on: setattr(proxy, "delay_s", 0.5 * on),
        }
        for mode in ("open", "closed"):
            url = proxy.url
            with stack.gateway(url, redis={"on_failure": mode}) as gateway:
                for name, fault in faults.items():
                    if mode == "closed" and name.startswith("slow"):
                        continue
                    with gateway_client(gateway, new_key(), f"deg-{uuid.uuid4().hex}") as client:
                        assert ask(client, "my tea is oolong")[1].status_code == 200
                        fault(True)
                        timings, statuses = [], set()
                        for i in range(runs):
                            took, response = ask(client, f"while down {i}")
                            timings.append(took)
                            statuses.add(
                                response.headers.get("x-memory-status")
                                if response.status_code == 200
                                else str(response.status_code)
                            )
                        fault(False)
                        resumed, ok_again = ask(client, "what is my tea?")
                        memory_back = ok_again.headers.get("x-memory-status") == "ok" and (
                            ok_again.json()["choices"][0]["message"]["content"]
                            == "Your tea is oolong."
                        )
                    p50, p99 = quantiles(timings)
                    expected = "degraded" if mode == "open" else "503"
                    rows.append(
                        Row(
                            "Redis",
                            f"fail-{mode}, {name}",
                            f"{runs} answers {'/'.join(sorted(statuses))}: p50 {ms(p50)}, "
                            f"p99 {ms(p99)}; memory back on the next request: "
                            f"{'yes' if memory_back else 'NO'} ({ms(resumed)})",
                            f"{expected} within {DEADLINE_MS} ms + margin",
                            statuses == {expected} and p99 < budget + 0.4 and memory_back,
                        )
                    )
    return rows


def redis_killed_under_load(stack: Stack, clients: int) -> list[Row]:
    """kill -9 under load: time to degrade, time to recover, and with AOF, turns lost."""
    with running_redis(appendonly=True) as redis_server, stack.gateway(redis_server.url) as gw:
        load = Load(gw, new_key(), clients=clients)
        with load:
            load.wait_for(acknowledged, 15 * clients, timeout=60)
            redis_server.stop(signal.SIGKILL)
            killed = time.monotonic()
            load.wait_for(lambda a: a.sent > killed, 2 * clients, timeout=60)
            time.sleep(0.5)
            redis_server.start()  # same port, same AOF directory
            up = time.monotonic()
            load.wait_for(lambda a: a.sent >= up and acknowledged(a), 5 * clients, timeout=60)
        answers = list(load.answers)
        acked, missing, _ = acknowledged_but_not_stored_once(load)
    errors = sum(1 for a in answers if a.status != 200)
    outage = [a.received - a.sent for a in answers if a.sent > killed and a.received < up]
    recovered = min(a.received for a in answers if a.sent >= up and acknowledged(a)) - up
    p50, p99 = quantiles(outage)
    return [
        Row(
            "Redis",
            f"kill -9 under load ({clients} clients, down 0.5 s)",
            f"{len(answers)} answers, {errors} errors; while down p50 {ms(p50)}, "
            f"p99 {ms(p99)}; first remembered turn {ms(recovered)} after Redis was back",
            "no errors; memory back without a restart",
            errors == 0 and recovered < 2.0,
        ),
        Row(
            "Redis",
            "AOF (appendfsync everysec) + kill -9 under load",
            f"{acked} acknowledged turns, lost or duplicated {len(missing)}",
            "0 lost",
            not missing,
        ),
    ]


# --- clients that leave -------------------------------------------------------------------


def disconnects(stack: Stack, runs: int) -> list[Row]:
    with running_redis() as redis_server, stack.gateway(redis_server.url) as gateway:
        report = measure_disconnects(gateway.url, stack.fake, api_key=new_key(), runs=runs)
    return [
        Row(
            "Upstream",
            f"client leaves before the first byte or mid-stream ({runs} runs)",
            f"upstream cancelled after p50 {ms(report.p50)}, p99 {ms(report.p99)} "
            f"({len(report.latencies_s)} measured); orphaned upstream streams {report.orphans}",
            "p99 < 1 s, 0 orphans",
            report.p99 < 1.0 and report.orphans == 0,
        )
    ]


# --- many requests on one session at once ------------------------------------------------


def concurrency(stack: Stack, sizes: list[int]) -> list[Row]:
    rows = []
    with (
        running_redis() as redis_server,
        stack.gateway(redis_server.url, redis={"timeout_ms": 3000}) as gateway,
        httpx.Client(base_url=gateway.url, timeout=60) as http,
    ):
        for history in (False, True):
            for n in sizes:
                rows.append(_burst(http, gateway, redis_server, n, history=history))
    return rows


def _burst(
    http: httpx.Client, gateway: ServerThread, redis_server: RedisProcess, n: int, *, history: bool
) -> Row:
    key, session = new_key(), f"burst-{uuid.uuid4().hex}"
    earlier: list[dict[str, str]] = []
    if history:
        for i in range(3):
            earlier += [{"role": "user", "content": f"earlier {i}"},
                        {"role": "assistant", "content": f"ack: earlier {i}"}]  # fmt: skip
    barrier = threading.Barrier(n)
    headers = {"Authorization": f"Bearer {key}", "X-Session-Id": session}

    def one(i: int) -> str:
        barrier.wait(10)
        body = {"model": "fake-model", "stream": i % 2 == 1,
                "messages": [*earlier, {"role": "user", "content": f"now {i}"}]}  # fmt: skip
        response = http.post("/v1/chat/completions", json=body, headers=headers)
        return response.headers.get("x-memory-status", str(response.status_code))

    with ThreadPoolExecutor(n) as pool:
        statuses = list(pool.map(one, range(n)))
    log = stored_log(redis_server, key, session)
    state = http.get(f"/memory/sessions/{session}", headers=headers).json()
    acked = [f"now {i}" for i, s in enumerate(statuses) if s == "ok"]
    acked += [m["content"] for m in earlier if m["role"] == "user"]
    problems = pairing_problems(log) + once_problems(log, acked)
    problems += numbering_problems(len(log), state)
    kind = "full-history clients (3 unseen turns each)" if history else "new messages"
    return Row(
        "Concurrency",
        f"{n} simultaneous requests, one session, {kind}",
        f"{len(acked)} turns acknowledged, {len(log)} messages stored, "
        f"{len(problems)} problems (duplicate, split or missing turns, gaps)",
        "every turn once, whole, gap-free",
        not problems and len(acked) == n + (3 if history else 0),
    )


# --- isolation and fuzzing: the suite's property tests, at a chosen scale -----------------

# Hypothesis drives these (shrinking, strategies, schemathesis's OpenAPI cases), so they
# live in the test suite; each prints a tally line that this section turns into a row.
PROPERTY_TESTS = [
    "tests/integration/test_isolation.py::test_no_tenant_ever_sees_another_tenants_messages",
    "tests/integration/test_fuzz.py",
]


def properties(scale: int) -> list[Row]:
    env = {**os.environ, "MEMORY_GATEWAY_FUZZ_SCALE": str(scale)}
    command = [sys.executable, "-m", "pytest", *PROPERTY_TESTS, "-q", "-s", "-p", "no:randomly"]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    tally_lines = [line for line in run.stderr.splitlines() if re.match(r"^[a-z][\w ,-]+: ", line)]
    tallies = dict(line.split(": ", 1) for line in tally_lines)
    passed = run.returncode == 0
    rows = [
        Row(
            "Isolation",
            "random tenants x shared session and user ids, every tier, ended sessions",
            tallies.get("isolation", "no tally printed"),
            "0 cross-tenant leaks",
            passed and "isolation" in tallies,
        )
    ]
    for name, label in (
        ("schemathesis, memory API", "memory API (schemathesis, OpenAPI document)"),
        ("hypothesis, chat-completions", "chat-completions bodies and headers (hypothesis)"),
    ):
        tally = tallies.get(name, "no tally printed")
        rows.append(
            Row(
                "Bad input",
                f"fuzzing the {label}",
                tally,
                "0 5xx, nothing stored from rejected requests",
                passed and name in tallies and "5xx" not in tally,
            )
        )
    if not passed:
        print(run.stdout[-3000:], file=sys.stderr)
    return rows


# --- report -------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    lines = ["| area | scenario | measured | target | met |", "|---|---|---|---|---|"]
    for row in rows:
        mark = "yes" if row.met else "**NO**"
        lines.append(f"| {row.area} | {row.scenario} | {row.measured} | {row.target} | {mark} |")
    return "\n".join(lines)


SECTIONS: dict[str, Callable[[Stack, bool], list[Row]]] = {
    "redis": lambda stack, quick: redis_degrades(stack, 10 if quick else 30),
    "redis-kill": lambda stack, quick: redis_killed_under_load(stack, 4 if quick else 8),
    "disconnects": lambda stack, quick: disconnects(stack, 20 if quick else 100),
    "concurrency": lambda stack, quick: concurrency(stack, [2, 10] if quick else [2, 10, 50]),
    "properties": lambda stack, quick: properties(1 if quick else 5),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs (a smoke test)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    # The gateway logs each degraded request; the table says what happened.
    logging.getLogger("gateway").setLevel(logging.ERROR)
    fake = FakeUpstream()
    rows: list[Row] = []
    started = time.monotonic()
    with ServerThread(fake.app()) as upstream:
        stack = Stack(fake, upstream)
        for name in args.only.split(","):
            section_start = time.monotonic()
            rows += SECTIONS[name](stack, args.quick)
            print(f"[{name}: {time.monotonic() - section_start:.1f} s]", file=sys.stderr)
    print(table(rows))
    print(f"\n{len(rows)} rows in {time.monotonic() - started:.0f} s; "
          f"{sum(not r.met for r in rows)} targets missed.")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0 if all(r.met for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
