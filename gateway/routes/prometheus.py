"""``GET /metrics``: Prometheus text, plus the summary-job backlog read from Redis.

The backlog is the job stream's, not a process's, per shard (``worker.job_shards``): it
is read at scrape time (one round trip with the server's clock, under a short deadline;
on a cluster, one to each master holding a shard, at once) and cached briefly,
so a burst of scrapes, or a Redis that is down, costs the gateway almost nothing.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.errors import error_body
from gateway.observability import metrics
from gateway.store.base import pairs
from gateway.store.keys import JOB_GROUP, job_stream
from gateway.store.link import Command
from gateway.store.redis_store import RedisStore

DEADLINE_S = 0.5
CACHE_S = 2.0


@dataclass(frozen=True, slots=True)
class JobBacklog:
    undelivered: int  # notices no worker has read yet (the group's lag)
    delivered: int  # read by a worker, not yet acknowledged
    oldest_age_s: float  # age of the oldest notice still in the stream; 0 when empty


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _entry_ms(entry_id: Any) -> int:
    return int(_text(entry_id).split("-", 1)[0])


def _field(group: dict[Any, Any], name: str) -> Any:
    return group.get(name, group.get(name.encode()))


def backlog_from(groups: Any, length: Any, oldest: Any, server_time: Any) -> JobBacklog:
    """The backlog from XINFO GROUPS, XLEN, XRANGE - + COUNT 1 and TIME replies.

    Acknowledged notices are deleted from the stream, so what remains is the backlog and
    its first entry the oldest unfinished job. An error reply (no stream yet) is no backlog.
    """
    count = length if isinstance(length, int) else 0
    listed = groups if isinstance(groups, list) else []
    group = next((g for g in listed if _text(_field(g, "name")) == JOB_GROUP), None)
    delivered = int(_field(group, "pending") or 0) if group is not None else 0
    lag = _field(group, "lag") if group is not None else None
    # Redis < 7 reports no lag: what is in the stream and not delivered is.
    undelivered = int(lag) if lag is not None else max(count - delivered, 0)
    age = 0.0
    if isinstance(oldest, list) and oldest and isinstance(server_time, tuple | list):
        now_ms = int(server_time[0]) * 1000 + int(server_time[1]) // 1000
        age = max(now_ms - _entry_ms(oldest[0][0]), 0) / 1000
    return JobBacklog(undelivered, delivered, age)


class JobBacklogReader:
    """Reads the backlog at most every ``CACHE_S``; one read at a time."""

    def __init__(self, store: RedisStore, clock: Any = time.monotonic) -> None:
        self.store = store
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
        shards = range(self.store.job_shards)
        commands: list[Command] = []
        for shard in shards:
            stream = job_stream(shard)
            commands.append(("XINFO", "GROUPS", stream))
            commands.append(("XLEN", stream))
            commands.append(("XRANGE", stream, "-", "+", "COUNT", 1))
        commands.append(("TIME",))
        try:
            # An error reply (a shard with no stream yet) is returned in its place.
            replies = await self.store.execute(
                commands, op="job_backlog", needed=0, timeout_s=DEADLINE_S
            )
        except Exception:  # a deadline, a connection error: a scrape never fails on Redis
            return None
        server_time = replies[-1]
        backlogs = {}
        for shard in shards:
            groups, length, oldest = replies[3 * shard : 3 * shard + 3]
            if isinstance(groups, list):  # each group a map: a dict in RESP3, a list in RESP2
                groups = [pairs(group) for group in groups]
            backlogs[shard] = backlog_from(groups, length, oldest, server_time)
        return backlogs


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
    def __init__(self, store: RedisStore, token: str | None) -> None:
        self.backlog = JobBacklogReader(store)
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
