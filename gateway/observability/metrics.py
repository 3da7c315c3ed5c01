"""Prometheus metrics: the metric objects, the request timer, and the helpers that feed them
(the request middleware, ``http/middleware.py``, reports each request here).

Multi-process: when ``PROMETHEUS_MULTIPROC_DIR`` is set *before this module is imported*,
prometheus_client keeps every value in a file of that directory, one set per process, and
a scrape (``exposition``) sums them with ``MultiProcessCollector``. Several workers (``serve
--workers N``) or several gateways on one host then answer every scrape with the same,
whole-fleet totals. Without the variable the values live in this process's memory.

Labels are bounded by construction: a route is its template ("/memory/sessions/{sid}"),
never the path; no label ever holds a tenant, a session id, a key or any content.

Latency definitions (all seconds, ``time.perf_counter``):
* upstream "headers": the upstream request sent -> its response headers received;
* upstream "total": the upstream request sent -> the last byte relayed to the client;
* added: request received -> response headers sent to the client, minus the upstream's
  share of that interval (its time to headers, or to the whole body when the gateway
  buffers a non-streaming answer). Observed only for requests that reached the upstream.
"""

from __future__ import annotations

import os
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.types import Scope

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The process's own registry (not prometheus_client's global one): tests and embedders
# that build several apps in one process never collide on registration.
REGISTRY = CollectorRegistry(auto_describe=True)

_FAST = (0.0001, 0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01)
_SLOW = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

REQUESTS = Counter(
    "memory_gateway_requests",
    "HTTP requests answered, by route template, method and status",
    ["route", "method", "status"],
    registry=REGISTRY,
)
IN_FLIGHT = Gauge(
    "memory_gateway_requests_in_flight",
    "Requests being served now (summed over live processes)",
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
ADDED_LATENCY = Histogram(
    "memory_gateway_added_latency_seconds",
    "Time the gateway adds before the client gets response headers (upstream time excluded)",
    ["route"],
    buckets=_FAST + _SLOW[:4],
    registry=REGISTRY,
)
UPSTREAM = Histogram(
    "memory_gateway_upstream_seconds",
    'Upstream time: phase="headers" to response headers, "total" to the last byte relayed',
    ["route", "phase"],
    buckets=_FAST[4:] + _SLOW,
    registry=REGISTRY,
)
REDIS = Histogram(
    "memory_gateway_redis_seconds",
    "Time of one store call (one round trip, or one bounded sequence), by store operation",
    ["op"],
    buckets=_FAST + _SLOW[:7],
    registry=REGISTRY,
)
CLIENT_TOKENS = Counter(
    "memory_gateway_client_tokens",
    "Tokens of the messages clients sent on memory requests (the saving: minus forwarded)",
    registry=REGISTRY,
)
FORWARDED_TOKENS = Counter(
    "memory_gateway_forwarded_tokens",
    "Tokens of the context the gateway forwarded upstream on memory requests",
    registry=REGISTRY,
)
# The upstream's own counts (its ``usage``) on memory requests whose answer reported
# them: cached / prompt is the prompt cache's real hit rate. The gateway's prediction
# (``upstream.prompt_cache``) is beside them: stable / forwarded.
UPSTREAM_PROMPT_TOKENS = Counter(
    "memory_gateway_upstream_prompt_tokens",
    "Prompt tokens the upstream reported in its usage on memory requests",
    registry=REGISTRY,
)
UPSTREAM_CACHED_TOKENS = Counter(
    "memory_gateway_upstream_cached_tokens",
    "Prompt tokens the upstream reported as served from its prompt cache on memory requests",
    registry=REGISTRY,
)
STABLE_TOKENS = Counter(
    "memory_gateway_context_stable_tokens",
    "Tokens of the forwarded contexts the gateway predicted the upstream could reuse "
    "from the session's previous request (upstream.prompt_cache)",
    registry=REGISTRY,
)
DEGRADED = Counter(
    "memory_gateway_degraded_requests",
    "Requests served without (part of) their memory, by reason",
    ["reason"],
    registry=REGISTRY,
)
KEYS_LOST = Counter(
    "memory_gateway_keys_lost",
    "Gateway keys made through the admin API that a process found gone with their "
    "registry's epoch (Redis lost its data): they no longer work",
    registry=REGISTRY,
)
TENANT_SECRET_REPLACED = Counter(
    "memory_gateway_tenant_secret_replaced",
    "Times a process found another tenant secret in Redis than the one it used and adopted "
    "it (Redis lost its data and another gateway made a new secret first): tenant ids "
    "changed; set server.tenant_secret",
    registry=REGISTRY,
)
STREAM_ERRORS = Counter(
    "memory_gateway_stream_errors",
    "Streams that ended with an in-band error event after a 200, by error code",
    ["code"],
    registry=REGISTRY,
)
# Requests sent again within a smaller budget after the upstream refused their context as
# longer than the model's window: many of them say a ``models:`` entry is due.
CONTEXT_RETRIES = Counter(
    "memory_gateway_context_retries",
    "Requests retried once with a smaller context after the upstream's context_length_exceeded",
    registry=REGISTRY,
)
JOBS_FAILED = Counter(
    "memory_gateway_jobs_failed",
    "Summary jobs that did not run to a result, by reason",
    ["reason"],
    registry=REGISTRY,
)
# Jobs that failed on every attempt they were allowed (``worker.job_attempts``) and left
# their session's pending jobs, so that its later jobs could run: each one a gap in the
# session's summaries (recall still reads its messages).
JOBS_DROPPED = Counter(
    "memory_gateway_jobs_dropped",
    "Summary jobs dropped after failing on every attempt, by the last failure's reason",
    ["reason"],
    registry=REGISTRY,
)
for _reason in ("error", "timeout", "conflict"):  # at 0 from the start: an alert needs a series
    JOBS_DROPPED.labels(_reason)
# Every question put to the summarizer's model, by what came of it: "ok" (its answer
# was used), "rejected" (it answered, summary_rules refused the answer), "failed" (the
# call failed or timed out), "fallback" (no model configured). All but "ok" end in the
# model-free summary, which a small model can make the usual case: this shows it.
SUMMARIES = Counter(
    "memory_gateway_summaries",
    "Summarizer model questions by outcome (ok, rejected, failed, fallback)",
    ["outcome"],
    registry=REGISTRY,
)
SUMMARY_OUTCOMES = ("ok", "rejected", "failed", "fallback")
for _outcome in SUMMARY_OUTCOMES:  # each shown from the start, at 0: a rate needs a series
    SUMMARIES.labels(_outcome)

# Child objects by label values: ``labels()`` validates and locks on every call, a dict
# lookup does not. The label values are bounded, so are these.
_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *values: str) -> Any:
    key = (metric, *values)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


def degraded(reason: str) -> None:
    _child(DEGRADED, reason).inc()


def keys_lost(count: int) -> None:
    KEYS_LOST.inc(count)


def tenant_secret_replaced() -> None:
    TENANT_SECRET_REPLACED.inc()


def stream_error(code: str) -> None:
    _child(STREAM_ERRORS, code).inc()


def context_retry() -> None:
    CONTEXT_RETRIES.inc()


def job_failed(reason: str) -> None:
    _child(JOBS_FAILED, reason).inc()


def job_dropped(reason: str) -> None:
    _child(JOBS_DROPPED, reason).inc()


def summary_outcome(outcome: str) -> None:
    _child(SUMMARIES, outcome).inc()


# --- Redis calls ---


def redis_op(op: str, started: float) -> None:
    """A store call's time; ``op``: the store operation (a name from code, never data)."""
    _child(REDIS, op).observe(time.perf_counter() - started)


# --- tokens ---


def tokens(client: int, forwarded: int, stable: int | None = None) -> None:
    """A memory request's tokens: sent by the client, forwarded, and of those the
    upstream could reuse by the gateway's prediction (None: no prediction)."""
    CLIENT_TOKENS.inc(client)
    FORWARDED_TOKENS.inc(forwarded)
    if stable is not None:
        STABLE_TOKENS.inc(stable)


def upstream_usage(prompt: int | None, cached: int | None) -> None:
    """The prompt and cached tokens an upstream reported for an answer (None: not said)."""
    if prompt is not None:
        UPSTREAM_PROMPT_TOKENS.inc(prompt)
    if cached is not None:
        UPSTREAM_CACHED_TOKENS.inc(cached)


# --- per-request timing ---

_TIMER_KEY = "memory_gateway.timer"


class RequestTimer:
    """When a request reached the gateway and when its upstream call started and answered."""

    __slots__ = ("received", "upstream_ready", "upstream_started")

    def __init__(self) -> None:
        self.received = time.perf_counter()
        self.upstream_started = 0.0
        self.upstream_ready = 0.0  # headers, or the whole body when the gateway buffers it

    def upstream_sent(self) -> None:
        self.upstream_started = time.perf_counter()

    def upstream_answered(self) -> None:
        self.upstream_ready = time.perf_counter()


_NO_TIMER = RequestTimer()  # requests the middleware does not see (metrics switched off)


def timer(scope: Scope) -> RequestTimer:
    timer: RequestTimer = scope.get(_TIMER_KEY, _NO_TIMER)
    return timer


def start_timer(scope: Scope) -> RequestTimer:
    """The request's timer, started now (by the request middleware, when it arrives)."""
    started = scope[_TIMER_KEY] = RequestTimer()
    return started


def request_done(
    route: str, method: str, status: int, request_timer: RequestTimer, headers_sent: float
) -> None:
    """A request answered (a stream: after its last byte): counted, and its upstream time
    and the latency the gateway added observed."""
    _child(REQUESTS, route, method, str(status)).inc()
    started, ready = request_timer.upstream_started, request_timer.upstream_ready
    if not started:
        return
    ended = time.perf_counter()
    _child(UPSTREAM, route, "total").observe(ended - started)
    if ready:
        _child(UPSTREAM, route, "headers").observe(ready - started)
        if headers_sent:
            added = headers_sent - request_timer.received - (ready - started)
            _child(ADDED_LATENCY, route).observe(max(added, 0.0))


# --- exposition ---


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


def exposition(extra: CollectorRegistry | None = None) -> bytes:
    """The text a scrape gets: every process's metrics (multi-process mode) or this one's,
    then ``extra`` (values read at scrape time)."""
    path = multiprocess_dir()
    if path is not None:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
        text = generate_latest(registry)
    else:
        text = generate_latest(REGISTRY)
    return text + (generate_latest(extra) if extra is not None else b"")
