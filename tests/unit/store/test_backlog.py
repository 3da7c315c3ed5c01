"""The job backlog from the replies of its one round trip (gateway/store/backlog.py)."""

from __future__ import annotations

from redis.exceptions import ResponseError

from gateway.store.backlog import JobBacklog, backlog_commands, backlog_from, backlogs_from
from gateway.store.keys import job_stream


def test_the_backlog_from_redis_replies() -> None:
    groups = [
        {"name": "other", "pending": 9, "lag": 9},
        {"name": b"summarizers", "pending": 2, "lag": 5},
    ]
    oldest = [(b"1000000-0", {b"job": b"j"})]
    assert backlog_from(groups, 7, oldest, (1004, 500_000)) == JobBacklog(5, 2, 4.5)


def test_the_backlog_without_lag_or_stream() -> None:
    # Redis < 7: no lag field; what the stream holds beyond the delivered is undelivered.
    groups = [{"name": "summarizers", "pending": 1, "lag": None}]
    assert backlog_from(groups, 4, [], (5, 0)) == JobBacklog(3, 1, 0.0)
    missing = ResponseError("no such key")
    assert backlog_from(missing, 0, [], (5, 0)) == JobBacklog(0, 0, 0.0)


def test_each_shard_is_asked_then_the_servers_clock() -> None:
    commands = backlog_commands(2)
    assert [command[-1] for command in commands[:3]] == [job_stream(0), job_stream(0), 1]
    assert commands[3] == ("XINFO", "GROUPS", job_stream(1))
    assert commands[-1] == ("TIME",) and len(commands) == 3 * 2 + 1


def test_each_shards_groups_in_resp3_or_resp2() -> None:
    resp3 = [[{b"name": b"summarizers", b"pending": 0, b"lag": 1}], 0, []]
    resp2 = [[[b"name", b"summarizers", b"pending", 1, b"lag", 10]], 0, []]
    found = backlogs_from([*resp3, *resp2, [b"0", b"0"]], 2)
    assert found == {0: JobBacklog(1, 0, 0.0), 1: JobBacklog(10, 1, 0.0)}
