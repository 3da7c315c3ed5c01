"""A hypothesis state machine over one real gateway: whatever happens, the log stays sound.

Steps mix sends (streaming or not), bursts of simultaneous sends, clients that leave
mid-stream, Redis restarts (with a degraded send while it is down), erasure and
summarization (flush). After every step the session's log, read straight from Redis, must
hold every acknowledged turn exactly once, each question followed by its own answer,
nothing from a client that left, numbering without gaps, and a rolling-summary version
that never went back since the last erasure.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import httpx
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from devsupport.invariants import (
    numbering_problems,
    once_problems,
    pairing_problems,
    version_problems,
)
from devsupport.servers import RedisProcess, ServerThread, running_redis
from devsupport.stored import stored_log
from tests.support.fixtures import USED_KEYS, GatewayFactory


class Stack:
    """The gateway and Redis every example of the machine shares."""

    def __init__(self, gateway: ServerThread, redis_server: RedisProcess) -> None:
        self.gateway = gateway
        self.redis = redis_server
        self.http = httpx.Client(base_url=gateway.url, timeout=30)


class SessionMachine(RuleBasedStateMachine):
    stack: ClassVar[Stack]

    def __init__(self) -> None:
        super().__init__()
        self.key = "sk-test-" + secrets.token_urlsafe(24)
        USED_KEYS.append(self.key)  # the end-of-suite scan looks for it in Redis and logs
        self.session = f"sm-{uuid.uuid4().hex[:10]}"
        self.acked: list[str] = []
        self.abandoned: list[str] = []
        self.left: list[str] = []  # clients that left mid-stream: never recorded
        self.versions: list[int] = []
        self.count = 0

    # --- helpers -------------------------------------------------------------------------

    def _text(self) -> str:
        self.count += 1
        return f"turn {self.count} of {self.session}"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", "X-Session-Id": self.session}

    def _send(self, text: str, *, stream: bool) -> str:
        """Send one message; its memory status when the whole answer came back."""
        body = {"model": "fake-model", "stream": stream,
                "messages": [{"role": "user", "content": text}]}  # fmt: skip
        response = self.stack.http.post("/v1/chat/completions", json=body, headers=self._headers())
        assert response.status_code == 200, response.text
        if stream:
            assert response.text.endswith("data: [DONE]\n\n")
        status = response.headers["x-memory-status"]
        assert status in ("ok", "degraded")
        return status

    def _acknowledge(self, text: str, status: str) -> None:
        # A degraded answer promised nothing: the turn may be missing (it is never half
        # there: the pairing invariant checks that).
        if status == "ok":
            self.acked.append(text)
        else:
            self.abandoned.append(text)

    # --- rules ---------------------------------------------------------------------------

    @initialize()
    def first_turn(self) -> None:
        text = self._text()
        self._acknowledge(text, self._send(text, stream=False))

    @rule(stream=st.booleans())
    def send(self, stream: bool) -> None:
        text = self._text()
        self._acknowledge(text, self._send(text, stream=stream))

    @rule(n=st.integers(2, 6))
    def send_at_once(self, n: int) -> None:
        texts = [self._text() for _ in range(n)]
        barrier = threading.Barrier(n)

        def one(i: int) -> str:
            barrier.wait(10)
            return self._send(texts[i], stream=i % 2 == 0)

        with ThreadPoolExecutor(n) as pool:
            statuses = list(pool.map(one, range(n)))
        for text, status in zip(texts, statuses, strict=True):
            self._acknowledge(text, status)

    @rule()
    def leave_mid_stream(self) -> None:
        text = self._text()
        body = {"model": "slow-stream", "stream": True,
                "messages": [{"role": "user", "content": text}]}  # fmt: skip
        with self.stack.http.stream(
            "POST", "/v1/chat/completions", json=body, headers=self._headers()
        ) as response:
            next(response.iter_raw())  # the first chunk, then the client is gone
        self.left.append(text)

    @rule()
    def redis_restarts(self) -> None:
        self.stack.redis.stop()
        text = self._text()
        assert self._send(text, stream=False) == "degraded"
        self.abandoned.append(text)
        self.stack.redis.start()  # same port, same AOF: nothing acknowledged is lost
        deadline = time.monotonic() + 5
        while True:  # memory resumes without restarting the gateway
            text = self._text()
            status = self._send(text, stream=False)
            self._acknowledge(text, status)
            if status == "ok":
                break
            assert time.monotonic() < deadline, "memory did not resume after Redis came back"

    @precondition(lambda self: self.acked)
    @rule()
    def erase(self) -> None:
        response = self.stack.http.delete(
            f"/memory/sessions/{self.session}", headers=self._headers()
        )
        assert response.status_code in (200, 204), response.text
        client = self.stack.redis.client()
        try:
            left = [k for k in client.scan_iter(count=1000) if self.session.encode() in k]
        finally:
            client.close()
        assert left == [], left
        self.acked.clear()
        self.abandoned.clear()
        self.versions.clear()

    @rule()
    def summarize(self) -> None:
        response = self.stack.http.post(
            f"/memory/sessions/{self.session}/flush", headers=self._headers()
        )
        assert response.status_code in (200, 404), response.text

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def log_is_sound(self) -> None:
        log = stored_log(self.stack.redis, self.key, self.session)
        problems = pairing_problems(log) + once_problems(log, self.acked)
        users = {m["content"] for m in log if m["role"] == "user"}
        problems += [
            f"{t!r} recorded though its client left mid-stream" for t in self.left if t in users
        ]
        response = self.stack.http.get(f"/memory/sessions/{self.session}", headers=self._headers())
        if log:
            assert response.status_code == 200, response.text
            state: dict[str, Any] = response.json()
            problems += numbering_problems(len(log), state)
            if state["rolling_summary"]:
                self.versions.append(state["rolling_summary"]["version"])
        problems += version_problems(self.versions)
        assert not problems, problems


def test_the_log_stays_sound_whatever_happens(make_gateway: GatewayFactory) -> None:
    with running_redis(appendonly=True) as redis_server:
        # rolling-summary rewrites its one summary every turn: the most version traffic.
        gateway = make_gateway(
            redis_url=redis_server.url, memory={"preset": "rolling-summary"},
            redis={"timeout_ms": 1000},
        )  # fmt: skip
        SessionMachine.stack = Stack(gateway, redis_server)
        try:
            run_state_machine_as_test(
                SessionMachine,
                settings=settings(
                    max_examples=12,
                    stateful_step_count=12,
                    deadline=None,
                    derandomize=True,
                    suppress_health_check=list(HealthCheck),
                ),
            )
        finally:
            SessionMachine.stack.http.close()
