"""The load generator of ``bench/overhead.py``: aiohttp clients in a process of their own.

It runs one job, read as JSON from stdin, and prints its result as JSON on stdout, so
that the client's CPU never shares a process (or a GIL) with what it measures:

``{"kind": "probe", "targets": [...], "n": 200, "model": "..."}``
    Concurrency 1, streaming, the targets interleaved (the order rotates every round so
    that none always follows another). Each request is timed from just before it is
    sent to: its response headers, its first SSE ``data:`` event, its last byte.

``{"kind": "closed", "target": {...}, "concurrency": 32, "duration_s": 5, "stream": false}``
    A closed loop: ``concurrency`` clients each send their next request as soon as the
    last one ended, for ``duration_s`` (or ``max_requests`` in all, if it comes first);
    requests in flight then are waited for. Reports
    completed requests per second, total times, errors, timeouts, X-Memory-Status.

A target is ``{"name", "url" (…/v1), "headers", "session_prefix"}``: with a
``session_prefix`` every request carries ``X-Session-Id`` and one new user message, as
a single-message client sends it; sessions rotate through a pool of ``sessions``. The
messages are the user side of ``bench/conversations.py``'s chat (small talk on four
topics, facts planted throughout), the same for every target, so that what recall
searches and indexes is like a real conversation.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.conversations import DEFAULT_DEPTHS, generate  # noqa: E402

# 2 conversations of 250 turns: 500 user messages, drawn in turn by every request.
TEXTS = tuple(
    message["content"]
    for number in range(2)
    for message in generate(6, number, 500, DEFAULT_DEPTHS).messages
    if message["role"] == "user"
)


class Target:
    def __init__(self, spec: dict[str, Any], sessions: int) -> None:
        self.name: str = spec["name"]
        self.url: str = spec["url"].rstrip("/") + "/chat/completions"
        self.headers: dict[str, str] = dict(spec.get("headers", {}))
        self.session_prefix: str | None = spec.get("session_prefix")
        self.sessions = max(1, sessions)
        self.counter = itertools.count()

    def request(self, model: str, stream: bool) -> tuple[dict[str, str], dict[str, Any]]:
        n = next(self.counter)
        headers = dict(self.headers)
        if self.session_prefix is not None:
            headers["X-Session-Id"] = f"{self.session_prefix}-{n % self.sessions}"
        text = TEXTS[n % len(TEXTS)]
        body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream}
        return headers, body


async def timed_request(
    http: aiohttp.ClientSession, target: Target, model: str, stream: bool
) -> dict[str, Any]:
    """One request: seconds to headers, first SSE event and last byte; status; error."""
    headers, body = target.request(model, stream)
    start = time.perf_counter()
    result: dict[str, Any] = {"status": 0, "memory": "", "error": ""}
    try:
        async with http.post(target.url, json=body, headers=headers) as response:
            result["headers"] = time.perf_counter() - start
            result["status"] = response.status
            result["memory"] = response.headers.get("x-memory-status", "")
            if stream:
                async for line in response.content:
                    if "first" not in result and line.startswith(b"data:"):
                        result["first"] = time.perf_counter() - start
                if "first" not in result and response.status == 200:
                    result["error"] = "no SSE event"
            else:
                await response.read()
            result["last"] = time.perf_counter() - start
    except TimeoutError:
        result["error"] = "timeout"
    except (aiohttp.ClientError, OSError) as error:
        result["error"] = type(error).__name__
    if not result["error"] and result["status"] != 200:
        result["error"] = f"http {result['status']}"
    return result


def client_session(job: dict[str, Any], connections: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, force_close=False),
        timeout=aiohttp.ClientTimeout(total=float(job.get("timeout_s", 30))),
    )


async def probe(job: dict[str, Any]) -> dict[str, Any]:
    targets = [Target(spec, job.get("sessions", 64)) for spec in job["targets"]]
    timings: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
    async with client_session(job, 4) as http:
        # Warm-up: connections opened, the servers' first-request costs paid.
        for target in targets:
            for _ in range(int(job.get("warmup", 20))):
                await timed_request(http, target, job["model"], True)
        for round_ in range(int(job["n"])):
            shift = round_ % len(targets)
            for target in targets[shift:] + targets[:shift]:
                timings[target.name].append(await timed_request(http, target, job["model"], True))
    return {"kind": "probe", "timings": timings}


async def closed(job: dict[str, Any]) -> dict[str, Any]:
    concurrency = int(job["concurrency"])
    target = Target(job["target"], job.get("sessions", max(1000, 4 * concurrency)))
    stream = bool(job.get("stream", False))
    model = job["model"]
    results: list[dict[str, Any]] = []
    async with client_session(job, concurrency) as http:
        for _ in range(int(job.get("warmup", 0))):
            await timed_request(http, target, model, stream)
        stop_at = time.perf_counter() + float(job["duration_s"])
        budget = itertools.count(int(job.get("max_requests", 0)) or 1 << 62, -1)

        async def client() -> None:
            while time.perf_counter() < stop_at and next(budget) > 0:
                results.append(await timed_request(http, target, model, stream))

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    ok = [r for r in results if not r["error"]]
    errors = Counter(r["error"] for r in results if r["error"])
    return {
        "kind": "closed",
        "elapsed_s": elapsed,
        "requests": len(results),
        "ok": len(ok),
        "rps": len(ok) / elapsed if elapsed else 0.0,
        "totals": [r["last"] for r in ok],
        "errors": dict(errors),
        "timeouts": errors.get("timeout", 0),
        "memory": dict(Counter(r["memory"] for r in ok)),
    }


def run_job(runner: Callable[[dict[str, Any]], Coroutine[Any, Any, dict[str, Any]]]) -> None:
    """A load process's life: its job from stdin (JSON), run on uvloop when installed, its
    result to stdout."""
    job = json.load(sys.stdin)
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        result = asyncio.run(runner(job))
    else:
        result = uvloop.run(runner(job))
    json.dump(result, sys.stdout)


def main() -> None:
    run_job(lambda job: {"probe": probe, "closed": closed}[job["kind"]](job))


if __name__ == "__main__":
    main()
