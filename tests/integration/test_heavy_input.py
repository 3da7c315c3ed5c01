"""Heavy input (issue 22): caps on a request's messages, and large messages processed off
the event loop while other tenants are answered.

A 4 MiB message of random letters used to hold the gateway's event loop for seconds
(tokenizing it on the loop, twice: the prompt, then the echoed answer): every other
tenant's requests waited. Here a ticker on the gateway's own loop measures how late its
wake-ups come while such a request is processed, and another tenant's requests run all
along.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import string
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from devsupport.fake_upstream import FakeUpstream
from devsupport.gateways import build_settings, start_gateway
from devsupport.servers import RedisProcess, ServerThread
from tests.support.fixtures import USED_KEYS

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisProcess]:
    """A Redis of this module's own: the megabytes stored here stay out of the suite's
    Redis, which is scanned for key material at the end of the run."""
    server = RedisProcess().start()
    yield server
    server.cleanup()


def _gateway(
    upstream: ServerThread, redis: RedisProcess, deadline_ms: int = 100, **server: Any
) -> ServerThread:
    settings = build_settings(
        upstream.url + "/v1",
        redis.url,
        server=server,
        memory={"preset": "hybrid-recall"},
        redis={"timeout_ms": deadline_ms},
    )
    return start_gateway(settings)


@pytest.fixture(scope="module")
def capped(
    fake_upstream_server: tuple[FakeUpstream, ServerThread], own_redis: RedisProcess
) -> Iterator[ServerThread]:
    """A gateway with small caps, for the tests that only send requests."""
    started = _gateway(fake_upstream_server[1], own_redis, max_messages=8, max_message_bytes=1000)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def roomy(
    fake_upstream_server: tuple[FakeUpstream, ServerThread], own_redis: RedisProcess
) -> Iterator[ServerThread]:
    """A gateway whose caps admit a 4 MiB message (an operator's choice). What a stall
    would be is measured directly: the loop's lag, and Redis's slow log. The other
    tenant's turns must be served and recorded meanwhile, within a deadline of 1 s, not
    Redis's default 100 ms: in this process, beside the heavy request's tokenizing threads
    on a loaded 2-core machine, 100 ms measures the scheduler (one such turn went degraded
    in one of six full runs, with the loop's lag and the slow log within bounds)."""
    started = _gateway(
        fake_upstream_server[1],
        own_redis,
        deadline_ms=1000,
        max_body_bytes=8 * MIB,
        max_message_bytes=6 * MIB,
    )
    yield started
    started.stop()


def _key() -> str:
    key = f"sk-heavy-{uuid.uuid4().hex}"
    USED_KEYS.append(key)
    return key


def _headers(key: str, session: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "X-Session-Id": session}


def _chat(*messages: dict[str, Any]) -> bytes:
    return json.dumps({"model": "fake-model", "messages": list(messages)}).encode()


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return dict(error)


# --- Caps ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        (_chat(*[_user(f"m{i}") for i in range(9)]), 400, "messages", "too_many_messages"),
        (_chat(_user("q"), _user("x" * 1001)), 413, "messages.1.content", "payload_too_large"),
        # Bytes, not characters: 400 characters of three bytes each.
        (_chat(_user("\u20ac" * 400)), 413, "messages.0.content", "payload_too_large"),
        (
            _chat(
                _user([{"type": "text", "text": "x" * 600}, {"type": "text", "text": "y" * 600}])
            ),
            413,
            "messages.0.content",
            "payload_too_large",
        ),
        (
            _chat(
                _user("q"),
                {
                    "role": "assistant",
                    "content": "calling",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "x" * 1000},
                        }
                    ],
                },
            ),
            413,
            "messages.1.tool_calls",
            "payload_too_large",
        ),
    ],
    ids=["count", "content", "utf-8 bytes", "content parts", "tool call arguments"],
)
def test_chat_caps_are_refused_with_an_error_naming_the_field(
    capped: ServerThread, body: bytes, status: int, param: str, code: str
) -> None:
    response = httpx.post(
        capped.url + "/v1/chat/completions", content=body, headers=_headers(_key(), "s-cap")
    )
    error = _error(response, status)
    assert (error["param"], error["code"]) == (param, code)


def test_chat_within_the_caps_is_answered(capped: ServerThread) -> None:
    body = _chat(*[_user(f"m{i}") for i in range(7)], _user("\u20ac" * 333))
    response = httpx.post(
        capped.url + "/v1/chat/completions", content=body, headers=_headers(_key(), "s-fits")
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-memory-status"] == "ok"


@pytest.mark.parametrize(
    ("messages", "status", "param"),
    [
        ([_user(f"m{i}") for i in range(9)], 400, "messages"),
        ([_user("q"), {"role": "assistant", "content": "x" * 1001}], 413, "messages.1.content"),
    ],
    ids=["count", "content"],
)
def test_memory_api_import_has_the_same_caps(
    capped: ServerThread, messages: list[dict[str, Any]], status: int, param: str
) -> None:
    key = _key()
    response = httpx.post(
        capped.url + "/memory/sessions/s-import/messages",
        json={"messages": messages},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert _error(response, status)["param"] == param
    # Nothing was stored.
    seen = httpx.get(
        capped.url + "/memory/sessions/s-import", headers={"Authorization": f"Bearer {key}"}
    )
    assert seen.status_code == 404, seen.text


def test_memory_api_context_has_the_same_caps(capped: ServerThread) -> None:
    response = httpx.post(
        capped.url + "/memory/sessions/s-context/context",
        content=_chat(*[_user(f"m{i}") for i in range(9)]),
        headers={"Authorization": f"Bearer {_key()}"},
    )
    assert _error(response, 400)["param"] == "messages"


# --- Large messages off the event loop -----------------------------------------------


class LoopLag:
    """A ticker on a running loop: how late its 5 ms sleeps wake, at worst, while on."""

    PERIOD_S = 0.005

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.worst = 0.0
        self._on = True
        self._task = asyncio.run_coroutine_threadsafe(self._tick(), loop)

    async def _tick(self) -> None:
        while self._on:
            started = self.loop.time()
            await asyncio.sleep(self.PERIOD_S)
            self.worst = max(self.worst, self.loop.time() - started - self.PERIOD_S)

    def stop(self) -> float:
        self._on = False
        self._task.result(timeout=30)
        return self.worst


@dataclass
class Victims:
    """Another tenant's small requests, one after another, until stopped."""

    url: str
    answers: list[tuple[float, int, str | None]] = field(default_factory=list)  # (end, ...)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        headers = _headers(_key(), f"victim-{uuid.uuid4().hex[:8]}")
        with httpx.Client(timeout=60) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                body = _chat(_user(f"a small question number {n} about the weather"))
                response = client.post(
                    self.url + "/v1/chat/completions", content=body, headers=headers
                )
                status = response.headers.get("x-memory-status")
                self.answers.append((time.monotonic(), response.status_code, status))

    def stop(self) -> list[tuple[float, int, str | None]]:
        self._stop.set()
        self._thread.join(60)
        return self.answers


def _random_letters(n: int) -> str:
    rng = random.Random(22)
    return "".join(rng.choices(string.ascii_letters, k=n))


def _distinct_words(n: int) -> str:
    rng = random.Random(455)
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choices(string.ascii_lowercase, k=rng.randint(5, 7))))
    return " ".join(words)


def _send_heavy(
    gateway: ServerThread, content: str
) -> tuple[httpx.Response, float, list[tuple[float, int, str | None]], float]:
    """Send ``content`` as one message while another tenant's requests run: the response,
    how long it took, the other tenant's answers meanwhile, and the loop's worst lag."""
    assert gateway.loop is not None
    warm_up = httpx.post(
        gateway.url + "/v1/chat/completions",
        content=_chat(_user("warm up")),
        headers=_headers(_key(), "warm-up"),
    )
    assert warm_up.status_code == 200
    victims = Victims(gateway.url)
    # The gateway runs in the suite's process, which holds every test's leftovers: a
    # full collection there (hundreds of ms, at a moment the collector picks) would be
    # counted as the gateway's stall. A served gateway freezes what it starts with and
    # collects rarely (gateway/http/gc_tuning.py); here the collector waits for the measure.
    gc.disable()
    try:
        lag = LoopLag(gateway.loop)
        started = time.monotonic()
        response = httpx.post(
            gateway.url + "/v1/chat/completions",
            content=_chat(_user(content)),
            headers=_headers(_key(), f"heavy-{uuid.uuid4().hex[:8]}"),
            timeout=120,
        )
        ended = time.monotonic()
        worst = lag.stop()
    finally:
        gc.enable()
    during = [answer for answer in victims.stop() if started <= answer[0] <= ended]
    return response, ended - started, during, worst


def test_a_4_mib_message_leaves_the_loop_to_other_tenants(roomy: ServerThread) -> None:
    """Today's cost: tokenizing 4 MiB of random letters takes ~3 s, twice (the message and
    the echoed answer). On the loop, the ticker waited that long; off it, far less than
    a quarter of the request's time (pieces of GIL-holding work, a few ms each)."""
    response, took, during, worst = _send_heavy(roomy, _random_letters(4 * MIB - 100))
    assert response.status_code == 200, response.text[:500]
    assert response.headers["x-memory-status"] == "ok"
    assert worst < took / 4, f"the loop stalled {worst:.2f} s of a {took:.2f} s request"
    assert len(during) >= 5, f"only {len(during)} other requests answered in {took:.2f} s"
    assert all(status == 200 and memory == "ok" for _, status, memory in during), during


def test_455k_distinct_words_are_recorded_without_stalling_redis_or_the_loop(
    roomy: ServerThread, own_redis: RedisProcess
) -> None:
    """One record of ~455,000 distinct words: the other tenant's turns stay recorded
    ("ok", not "degraded"), no Redis command runs long (the slow log), and the message
    is stored."""
    text = _distinct_words(455_000)
    redis = own_redis.client()
    before = redis.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    # Recording copies the message and its echoed answer (~7 MB): ~35 ms here. Work per
    # distinct word (the index the issue measured in Redis) took 1.6 s.
    redis.config_set("slowlog-log-slower-than", 200_000)  # microseconds
    redis.slowlog_reset()
    try:
        response, took, during, worst = _send_heavy(roomy, text)
        slow = [(entry["duration"], entry["command"][:40]) for entry in redis.slowlog_get(16)]
    finally:
        redis.config_set("slowlog-log-slower-than", before)
    assert response.status_code == 200, response.text[:500]
    assert response.headers["x-memory-status"] == "ok"
    assert not slow, f"Redis commands over 200 ms: {slow}"
    assert worst < took / 4, f"the loop stalled {worst:.2f} s of a {took:.2f} s request"
    assert during and all(status == 200 and memory == "ok" for _, status, memory in during), during
    stored = [json.loads(raw)["content"] for key in redis.scan_iter(match="mg:*:log")
              for raw in redis.lrange(key, 0, -1)]  # fmt: skip
    assert text in stored
    redis.close()
