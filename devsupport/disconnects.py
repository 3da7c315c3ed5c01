"""Clients that leave on purpose, and how fast the upstream hears of it.

``RawChat`` is one chat request over a plain socket, so the caller decides to the moment
when the client goes away (an HTTP library would buffer, retry or linger).
``measure_disconnects`` runs many of them against a gateway in front of a ``FakeUpstream``
(in the same process: both clocks are ``time.monotonic()``), each leaving at a random
point, and reports how long the upstream call outlived its client. Tests assert on it;
a benchmark script can print it.
"""

from __future__ import annotations

import json
import math
import random
import re
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from devsupport.fake_upstream import FakeUpstream

_HEAD_END = b"\r\n\r\n"
_TAG = re.compile(r"probe-[0-9a-f]{10}")


class RawChat:
    """``POST /v1/chat/completions`` over a raw socket; the body is de-chunked as it arrives."""

    def __init__(
        self, base_url: str, body: dict[str, Any], headers: dict[str, str], *, timeout: float = 10
    ) -> None:
        url = urlsplit(base_url)
        host, port = url.hostname or "127.0.0.1", url.port or 80
        payload = json.dumps(body).encode()
        lines = [
            "POST /v1/chat/completions HTTP/1.1",
            f"Host: {host}:{port}",
            "Content-Type: application/json",
            f"Content-Length: {len(payload)}",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        self.head = b""
        self.body = b""
        self._raw = b""
        self._chunked = False
        self.ended = False  # the server finished the response (or closed the connection)
        self.left_at: float | None = None

    def read_until(self, done: Callable[[RawChat], bool], timeout: float = 10) -> bool:
        """Read until ``done(self)``; False if the response ended or time ran out first."""
        deadline = time.monotonic() + timeout
        while not done(self):
            remaining = deadline - time.monotonic()
            if self.ended or remaining <= 0:
                return False
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return False
            if not data:
                self.ended = True
            self._take(data)
        return True

    def has_head(self) -> bool:
        return bool(self.head)

    def events(self) -> list[str]:
        """The ``data:`` payloads received so far."""
        text = self.body.decode("utf-8", "replace")
        return [line[6:] for line in text.split("\n") if line.startswith("data: ")]

    @property
    def status(self) -> int:
        return int(self.head.split(b" ", 2)[1])

    def leave(self) -> float:
        """Close the connection, as a client that gave up; returns when (monotonic)."""
        self.sock.close()
        self.left_at = time.monotonic()
        return self.left_at

    def _take(self, data: bytes) -> None:
        self._raw += data
        if not self.head:
            if _HEAD_END not in self._raw:
                return
            self.head, self._raw = self._raw.split(_HEAD_END, 1)
            self._chunked = b"transfer-encoding: chunked" in self.head.lower()
        if not self._chunked:
            self.body, self._raw = self.body + self._raw, b""
            return
        while b"\r\n" in self._raw:
            size_line, rest = self._raw.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            if len(rest) < size + 2:
                return
            self.body += rest[:size]
            self._raw = rest[size + 2 :]
            if size == 0:
                self.ended = True
                return


# Where a client leaves: while the gateway waits for the upstream's headers, after the
# headers but before the first chunk, or in the middle of the answer.
PHASES = ("before-headers", "before-first-chunk", "mid-stream")
_PHASE_MODEL = {
    "before-headers": "slow-first-byte",  # 3 s before the headers
    "before-first-chunk": "slow-first-chunk",  # headers, then 3 s before the first chunk
    "mid-stream": "slow-stream",  # a chunk every 0.3 s; 14 words here: over 4 s
}


@dataclass(frozen=True)
class _Plan:
    tag: str
    phase: str
    stream: bool
    wait_s: float  # how long the client stays after reaching its phase
    chunks: int  # mid-stream: content chunks read before leaving


@dataclass(frozen=True)
class _Left:
    plan: _Plan
    left_at: float | None  # None: the answer ended before the client could leave


@dataclass(frozen=True)
class DisconnectReport:
    runs: int
    latencies_s: tuple[float, ...]  # upstream noticed minus client left, one per measured run
    orphans: int  # upstream calls still open ``settle_s`` after their client left
    not_reached: int  # the client left before the gateway had forwarded the request
    finished: int  # the upstream finished its answer anyway (the client left too late)
    settle_s: float

    def percentile(self, q: float) -> float:
        """Nearest-rank percentile of the latencies (``q`` in 0..1)."""
        ordered = sorted(self.latencies_s)
        if not ordered:
            return math.nan
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    @property
    def p50(self) -> float:
        return self.percentile(0.5)

    @property
    def p99(self) -> float:
        return self.percentile(0.99)

    def summary(self) -> str:
        return (
            f"{self.runs} disconnects: {len(self.latencies_s)} measured, "
            f"upstream cancelled after p50 {self.p50 * 1000:.1f} ms, "
            f"p99 {self.p99 * 1000:.1f} ms, max {max(self.latencies_s, default=0) * 1000:.1f} ms; "
            f"orphaned upstream calls after {self.settle_s:g} s: {self.orphans}; "
            f"not reached {self.not_reached}, finished anyway {self.finished}"
        )


def _plans(runs: int, seed: int) -> list[_Plan]:
    rng = random.Random(seed)
    plans = []
    for i in range(runs):
        phase = PHASES[i % len(PHASES)] if i < len(PHASES) else rng.choice(PHASES)
        plans.append(
            _Plan(
                tag=f"probe-{uuid.uuid4().hex[:10]}",
                phase=phase,
                # The wait for headers is the same with or without stream=true.
                stream=phase != "before-headers" or rng.random() < 0.5,
                wait_s=rng.uniform(0.0, 0.3) if phase == "mid-stream" else rng.uniform(0.05, 0.8),
                chunks=rng.randint(1, 3),
            )
        )
    return plans


def _run(gateway_url: str, api_key: str, plan: _Plan) -> _Left:
    body = {
        "model": _PHASE_MODEL[plan.phase],
        "stream": plan.stream,
        "messages": [{"role": "user", "content": plan.tag + " a b c d e f g h i j k l"}],
    }
    headers = {"Authorization": f"Bearer {api_key}", "X-Session-Id": f"sess-{plan.tag}"}
    client = RawChat(gateway_url, body, headers)
    try:
        if plan.phase == "before-first-chunk" and not client.read_until(RawChat.has_head):
            return _Left(plan, None)
        if plan.phase == "mid-stream" and not client.read_until(
            lambda c: len(c.events()) > plan.chunks  # the role chunk, then content
        ):
            return _Left(plan, None)
        time.sleep(plan.wait_s)
        if client.ended:
            return _Left(plan, None)
        return _Left(plan, client.leave())
    finally:
        client.sock.close()


def measure_disconnects(
    gateway_url: str,
    fake: FakeUpstream,
    *,
    api_key: str,
    runs: int = 50,
    concurrency: int = 10,
    settle_s: float = 2.0,
    seed: int = 0,
) -> DisconnectReport:
    """``runs`` clients leave at random points; how long did each upstream call outlive them?

    The gateway must use ``fake`` as its upstream, with ``first_byte_s`` and ``idle_s``
    above 3 s (else the gateway's own timeouts end the calls, not the disconnects).
    """
    plans = _plans(runs, seed)
    with ThreadPoolExecutor(concurrency) as pool:
        left = list(pool.map(lambda plan: _run(gateway_url, api_key, plan), plans))
    last = max((run.left_at for run in left if run.left_at is not None), default=time.monotonic())
    time.sleep(max(0.0, last + settle_s - time.monotonic()))

    still_open = " ".join(call.prompt for call in list(fake.in_flight))
    noticed = {_tag(d.prompt): d.at for d in list(fake.disconnects)}
    reached = {_tag(r.body.decode("utf-8", "replace")) for r in list(fake.requests)}
    latencies: list[float] = []
    orphans = not_reached = finished = 0
    for run in left:
        tag = run.plan.tag
        if tag in still_open:
            orphans += 1
        elif run.left_at is None or tag not in noticed:
            # Left too late (the answer was complete), or before the upstream was asked.
            finished += tag in reached
            not_reached += tag not in reached
        else:
            latencies.append(noticed[tag] - run.left_at)
    return DisconnectReport(runs, tuple(latencies), orphans, not_reached, finished, settle_s)


def _tag(prompt: str) -> str:
    found = _TAG.search(prompt)
    return found.group(0) if found else ""
