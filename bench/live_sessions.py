"""Sessions of a given length, grown live: what ``bench/overhead.py``'s ``sessions``
section sends, and what it makes of the timings.

The helpers import conversations through the gateway's memory API (jobs left to the
worker: no flush) and read the sessions' state (pending jobs, messages). Run as a script,
the module is the section's load generator, in a process of its own as ``bench/load.py``
(whose timed request and aiohttp client it uses): one job as JSON on stdin, its timings
as JSON on stdout.

``{"targets": [...], "n": 60, "warmup": 5, "models": {"json": ..., "sse": ...}, "seed": 13}``
    Concurrency 1, one keep-alive client. Each round sends every target one
    non-streamed and one streamed request, the pairs in an order that rotates every
    round (as ``bench/load.py``'s probe), so that the machine's drift and the worker's
    jobs reach every target alike. A target with ``sessions`` sends each request to the
    next of them (``X-Session-Id``) with one user message never sent before in the run:
    each turn grows its session by the message and the answer. A target without
    (``direct``: the upstream) gets the same kind of message.
    Reported per target and mode: the seconds to the response headers, to the first SSE
    event (streamed) and to the last byte.
"""

from __future__ import annotations

import itertools
import math
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._harness import quantile  # noqa: E402
from bench.conversations import generate  # noqa: E402

IMPORT_BATCH = 500  # messages per import request (the gateway's own batch)
MODES = ("json", "sse")
# The time a mode is judged by: a non-streamed answer is of use once whole; a streamed
# one from its first event.
STAGE = {"json": "last", "sse": "first"}
DIRECT = "direct"


# --- Sessions, through the memory API -----------------------------------------------------


def history(size: int, number: int, seed: int) -> list[dict[str, str]]:
    """``size`` messages of small talk, another conversation for each ``number``.

    One planted fact only: the checks that keep every planted value unambiguous cost
    0.5 s for 400 messages with the usual five, and nothing here asks for a fact."""
    return list(generate(seed, number, max(size, 100), (0.0,)).messages[:size])


def import_sessions(http: httpx.Client, ids: Sequence[str], size: int, seed: int) -> None:
    """Each session's history imported as it is; its summary jobs are left to the worker."""
    for number, session in enumerate(ids):
        messages = history(size, number, seed)
        for start in range(0, len(messages), IMPORT_BATCH):
            batch = {"messages": messages[start : start + IMPORT_BATCH]}
            response = http.post(f"/memory/sessions/{session}/messages", json=batch)
            if response.status_code != 200:
                raise RuntimeError(f"import {session}: {response.status_code} {response.text}")


def states(http: httpx.Client, ids: Sequence[str]) -> dict[str, float]:
    """The sessions' pending jobs (in all) and messages (mean), as the memory API says."""
    pending, messages = 0, []
    for session in ids:
        response = http.get(f"/memory/sessions/{session}")
        response.raise_for_status()
        state = response.json()
        pending += int(state["pending_jobs"])
        messages.append(int(state["message_count"]))
    return {"pending_jobs": pending, "messages_mean": statistics.mean(messages)}


def pool(turns: int, turns_per_session: int) -> int:
    """Sessions enough that none grows by more than ``turns_per_session`` turns."""
    return max(1, math.ceil(turns / turns_per_session))


# --- What the timings say -----------------------------------------------------------------


def summary(timings: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per session target and mode: its p50/p99, direct's, and the difference (added).

    A quantile of the target minus the same quantile of the direct calls interleaved
    with it, as the probe's; failed requests left out (counted apart)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key, runs in timings.items():
        target, mode = key.split("/")
        if target == DIRECT:
            continue
        ok = [t[STAGE[mode]] for t in runs if not t["error"]]
        direct = [t[STAGE[mode]] for t in timings[f"{DIRECT}/{mode}"] if not t["error"]]
        row: dict[str, float] = {}
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            row[name] = quantile(ok, q)
            row[f"direct_{name}"] = quantile(direct, q)
            row[f"added_{name}"] = row[name] - row[f"direct_{name}"]
        out.setdefault(target, {})[mode] = row
    return out


def ratio(long: float, short: float) -> float:
    """``long`` over ``short``; a short session that adds nothing (or less than nothing,
    direct's noise) makes any added latency an infinite ratio."""
    return long / short if short > 0 else math.inf


# --- The load generator (a process of its own) --------------------------------------------


def new_messages(seed: int) -> Iterator[str]:
    """User messages, each once: small talk of conversations not imported anywhere."""
    seen: set[str] = set()
    for number in itertools.count():
        for message in generate(seed, number, 400, (0.0,)).messages:
            if message["role"] == "user" and message["content"] not in seen:
                seen.add(message["content"])
                yield message["content"]


class SessionTarget:
    """bench/load.py's target interface (``name``, ``url``, ``request``) for a pool of
    sessions: each request to the next session, with the next new message."""

    def __init__(self, spec: dict[str, Any], texts: Iterator[str]) -> None:
        self.name: str = spec["name"]
        self.url: str = spec["url"].rstrip("/") + "/chat/completions"
        self.headers: dict[str, str] = dict(spec.get("headers", {}))
        self.sessions: list[str] = list(spec.get("sessions") or [])
        self.texts = texts
        self.counter = itertools.count()

    def request(self, model: str, stream: bool) -> tuple[dict[str, str], dict[str, Any]]:
        n = next(self.counter)
        headers = dict(self.headers)
        if self.sessions:
            headers["X-Session-Id"] = self.sessions[n % len(self.sessions)]
        content = next(self.texts)
        body = {"model": model, "messages": [{"role": "user", "content": content}]}
        return headers, {**body, "stream": stream}


async def drive(job: dict[str, Any]) -> dict[str, Any]:
    # aiohttp: only in the load generator's process
    from bench.load import client_session, timed_request

    texts = new_messages(int(job.get("seed", 13)))
    targets = [SessionTarget(spec, texts) for spec in job["targets"]]
    pairs = [(target, mode) for target in targets for mode in MODES]
    timings: dict[str, list[dict[str, Any]]] = {f"{t.name}/{m}": [] for t, m in pairs}
    models = job["models"]
    async with client_session(job, 4) as http:
        warmup = int(job.get("warmup", 5))
        for round_ in range(warmup + int(job["n"])):
            shift = round_ % len(pairs)
            for target, mode in pairs[shift:] + pairs[:shift]:
                # Duck-typed as load.py's Target: the same three members.
                result = await timed_request(http, target, models[mode], mode == "sse")  # type: ignore[arg-type]
                if round_ >= warmup:
                    timings[f"{target.name}/{mode}"].append(result)
    return {"timings": timings}


def main() -> None:
    from bench.load import run_job  # aiohttp: only in the load generator's process

    run_job(drive)


if __name__ == "__main__":
    main()
