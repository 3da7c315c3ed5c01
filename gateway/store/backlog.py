"""The summary-job backlog as ``/metrics`` shows it, read from the job stream's shards:
the commands of one round trip and the decoding of their replies (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.store.calls import pairs
from gateway.store.keys import JOB_GROUP, job_stream
from gateway.store.link import Command


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


def backlog_commands(shards: int) -> list[Command]:
    """Per shard XINFO GROUPS, XLEN and its oldest entry; then the server's clock."""
    commands: list[Command] = []
    for shard in range(shards):
        stream = job_stream(shard)
        commands.append(("XINFO", "GROUPS", stream))
        commands.append(("XLEN", stream))
        commands.append(("XRANGE", stream, "-", "+", "COUNT", 1))
    commands.append(("TIME",))
    return commands


def backlogs_from(replies: list[Any], shards: int) -> dict[int, JobBacklog]:
    """Each shard's backlog from the replies to ``backlog_commands(shards)``."""
    server_time = replies[-1]
    backlogs = {}
    for shard in range(shards):
        groups, length, oldest = replies[3 * shard : 3 * shard + 3]
        if isinstance(groups, list):  # each group a map: a dict in RESP3, a list in RESP2
            groups = [pairs(group) for group in groups]
        backlogs[shard] = backlog_from(groups, length, oldest, server_time)
    return backlogs


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
