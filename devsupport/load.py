"""Load and timing helpers for fault tests and ``bench/faults.py``: real clients, real sockets.

``Load`` runs single-message clients (one session each) against a gateway until stopped
and keeps every answer; ``acknowledged_but_not_stored_once`` then reads each session's
log through the export API and names the acknowledged turns that are not stored exactly
once, in order, beside their own answer.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from devsupport.servers import ServerThread


def ask(client: httpx.Client, text: str) -> tuple[float, httpx.Response]:
    """One user message to the fake model, as a single-message client sends it; how long."""
    body = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
    start = time.monotonic()
    response = client.post("/v1/chat/completions", json=body)
    return time.monotonic() - start, response


def timed_asks(client: httpx.Client, n: int, question: str) -> tuple[list[float], set[str]]:
    """Send ``question`` n times; the latencies and the memory statuses seen."""
    timings, statuses = [], set()
    for _ in range(n):
        took, response = ask(client, question)
        timings.append(took)
        assert response.status_code == 200, response.text
        statuses.add(response.headers["x-memory-status"])
    return timings, statuses


def report(label: str, timings: list[float]) -> str:
    ordered = sorted(timings)
    p50 = statistics.median(ordered)
    return f"{label}: n={len(ordered)} p50={p50 * 1000:.0f} ms max={ordered[-1] * 1000:.0f} ms"


def gateway_client(gateway: ServerThread, key: str, session: str) -> httpx.Client:
    return httpx.Client(
        base_url=gateway.url,
        headers={"Authorization": f"Bearer {key}", "X-Session-Id": session},
        timeout=30,
    )


@dataclass(frozen=True)
class Answer:
    client: int
    text: str  # the user message sent
    status: int
    memory: str  # X-Memory-Status, "" when absent
    sent: float
    received: float


@dataclass
class Load:
    """Concurrent single-message clients, one session each, until stopped.

    Streamed (``stream=True``), an answer counts as acknowledged (``memory == "ok"``) only
    when its stream ended with ``[DONE]``; otherwise ``memory`` is "degraded" when the
    header said so, else "unacknowledged"."""

    gateway: ServerThread
    key: str
    clients: int
    stream: bool = False
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def session(self, client: int) -> str:
        return f"load-{self.run}-{client}"

    def _run(self, client: int) -> None:
        with gateway_client(self.gateway, self.key, self.session(client)) as http:
            n = 0
            while not self._stop.is_set():
                n += 1
                text = f"turn {n} of client {client}"
                body = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
                sent = time.monotonic()
                try:
                    status, memory = (self._streamed if self.stream else self._whole)(http, body)
                except httpx.HTTPError:
                    status, memory = -1, ""  # no answer at all: counted as a failure
                self.answers.append(Answer(client, text, status, memory, sent, time.monotonic()))

    @staticmethod
    def _whole(http: httpx.Client, body: dict[str, Any]) -> tuple[int, str]:
        response = http.post("/v1/chat/completions", json=body)
        return response.status_code, response.headers.get("x-memory-status", "")

    @staticmethod
    def _streamed(http: httpx.Client, body: dict[str, Any]) -> tuple[int, str]:
        with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data:")]
        header = r.headers.get("x-memory-status", "")
        if header == "ok":
            header = "ok" if lines and lines[-1] == "data: [DONE]" else "unacknowledged"
        return r.status_code, header

    def __enter__(self) -> Load:
        self._threads = [
            threading.Thread(target=self._run, args=(c,), daemon=True) for c in range(self.clients)
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def wait_for(self, predicate: Callable[[Answer], bool], count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while sum(1 for a in list(self.answers) if predicate(a)) < count:
            assert time.monotonic() < deadline, f"load did not reach {count} answers"
            time.sleep(0.01)


def acknowledged(answer: Answer) -> bool:
    """A non-streamed answer with X-Memory-Status: ok: its turn was stored before it left."""
    return answer.memory == "ok"


def stored_lines(gateway: ServerThread, key: str, session: str) -> list[str]:
    """The session's whole log through the export API, as "role: content" lines."""
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {key}"}) as http:
        response = http.get(f"/memory/sessions/{session}/export", timeout=30)
    assert response.status_code == 200, response.text
    return [f"{m['role']}: {m['content']}" for m in response.json()["messages"]]


def acknowledged_but_not_stored_once(load: Load) -> tuple[int, list[str], int]:
    """(acknowledged turns, those not stored exactly once as a user+answer pair, in the
    order sent, and the count of degraded turns that were stored anyway)."""
    acknowledged, missing, stored_degraded = 0, [], 0
    for client in range(load.clients):
        log = stored_lines(load.gateway, load.key, load.session(client))
        counts = Counter(log)
        position = -1
        for answer in (a for a in load.answers if a.client == client):
            user = f"user: {answer.text}"
            if answer.memory != "ok":
                stored_degraded += counts[user] > 0
                continue
            acknowledged += 1
            where = log.index(user) if user in counts else -1
            # Once, in the order sent, and followed by its own answer (appended together).
            if (
                counts[user] != 1
                or where < position
                or log[where + 1 : where + 2] != [f"assistant: ack: {answer.text}"]
            ):
                missing.append(user)
            position = max(position, where)
    return acknowledged, missing, stored_degraded
