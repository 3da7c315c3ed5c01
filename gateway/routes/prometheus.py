"""``GET /metrics``: Prometheus text, plus the summary-job backlog read from Redis.

The backlog is the job stream's, not a process's, per shard (``worker.job_shards``): it
is read at scrape time (one round trip with the server's clock, under a short deadline;
on a cluster, one to each master holding a shard, at once) and cached briefly,
so a burst of scrapes, or a Redis that is down, costs the gateway almost nothing.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.errors import error_body
from gateway.observability import metrics
from gateway.store.backlog import JobBacklog
from gateway.store.redis_store import StoreUnavailable

log = logging.getLogger(__name__)

DEADLINE_S = 0.5
CACHE_S = 2.0


class BacklogSource(Protocol):
    """Where the backlog is read: the store's job queue (``store.queue``)."""

    async def backlog(self, *, timeout_s: float) -> dict[int, JobBacklog]: ...


class JobBacklogReader:
    """Reads the backlog at most every ``CACHE_S``; one read at a time."""

    def __init__(self, queue: BacklogSource, clock: Any = time.monotonic) -> None:
        self.queue = queue
        self.clock = clock
        self._lock = asyncio.Lock()
        self._cached: dict[int, JobBacklog] | None = None
        self._read_at = -CACHE_S

    async def read(self) -> dict[int, JobBacklog] | None:
        """The backlog of each shard, or None when Redis did not answer in time."""
        async with self._lock:
            if self.clock() - self._read_at >= CACHE_S:
                self._cached = await self._query()
                self._read_at = self.clock()
            return self._cached

    async def _query(self) -> dict[int, JobBacklog] | None:
        try:
            return await self.queue.backlog(timeout_s=DEADLINE_S)
        except StoreUnavailable:  # a deadline, a connection error: a scrape never fails on Redis
            return None
        except Exception:  # a reply the gateway could not read: said, still not a failed scrape
            log.exception("the job backlog could not be read")
            return None


class _BacklogCollector(Collector):
    def __init__(self, backlog: dict[int, JobBacklog] | None) -> None:
        self.backlog = backlog

    def collect(self) -> list[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "memory_gateway_jobs_backlog_up", "1 if this scrape could read the job backlog"
        )
        up.add_metric([], 0 if self.backlog is None else 1)
        if self.backlog is None:
            return [up]
        pending = GaugeMetricFamily(
            "memory_gateway_jobs_pending",
            "Summary-job notices not yet done, per job-stream shard: undelivered (the "
            "group's lag) or delivered (not acknowledged)",
            labels=["state", "shard"],
        )
        lag = GaugeMetricFamily(
            "memory_gateway_jobs_lag_seconds",
            "Age of the oldest summary-job notice not yet done, per job-stream shard",
            labels=["shard"],
        )
        for shard, backlog in sorted(self.backlog.items()):
            pending.add_metric(["undelivered", str(shard)], backlog.undelivered)
            pending.add_metric(["delivered", str(shard)], backlog.delivered)
            lag.add_metric([str(shard)], backlog.oldest_age_s)
        return [up, pending, lag]


class MetricsEndpoint:
    def __init__(
        self, queue: BacklogSource, token: str | None, clock: Any = time.monotonic
    ) -> None:
        self.backlog = JobBacklogReader(queue, clock)
        self.expected = f"Bearer {token}".encode() if token else None

    async def handle(self, request: Request) -> Response:
        if self.expected is not None:
            given = request.headers.get("authorization", "").encode("latin-1", "replace")
            if not hmac.compare_digest(given, self.expected):
                return JSONResponse(
                    error_body("a valid metrics token is required", "authentication_error"),
                    status_code=401,
                    headers={"www-authenticate": "Bearer"},
                )
        extra = CollectorRegistry()
        extra.register(_BacklogCollector(await self.backlog.read()))
        return Response(metrics.exposition(extra), media_type=metrics.CONTENT_TYPE)
