"""The key registry fails closed: a process that cannot read the admin API's keys stops
taking them once its view is older than ``auth.stale_after_s`` (issue 32: a key revoked
during a partition kept working on the cut-off process)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.auth.authenticator import KeyRecord, KeyRegistry, key_id, watch
from gateway.config import AuthConfig
from gateway.errors import KeysUnavailable
from gateway.observability import metrics

CONFIGURED = "gw-key-configured-0123456"
MADE = "gw-key-made-by-admin-0123"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def registry(clock: Clock) -> KeyRegistry:
    config = AuthConfig(mode="keys", keys=[{"key": CONFIGURED, "tenant": "t"}], stale_after_s=5.0)
    return KeyRegistry(config, clock)


def stored(*records: dict[str, Any]) -> dict[str, bytes]:
    """The admin API's keys as the store reads them: each record's JSON by key id."""
    return {r["id"]: json.dumps(r).encode() for r in records}


def made() -> dict[str, bytes]:
    return stored({"id": key_id(MADE), "tenant": "t"})


def test_a_stored_key_stops_working_once_the_view_is_stale() -> None:
    clock = Clock()
    keys = registry(clock)
    assert keys.lookup(MADE) is None  # never read: no stored key to honour, a 401
    keys.replace(1, made())
    assert keys.lookup(MADE) is not None
    clock.now += 4.9
    assert keys.lookup(MADE) is not None
    clock.now += 0.2  # 5.1 s without a successful read
    with pytest.raises(KeysUnavailable):
        keys.lookup(MADE)
    with pytest.raises(KeysUnavailable):
        keys.lookup("gw-key-unknown-000000000")  # unknown: not knowable either
    assert keys.lookup(CONFIGURED) is not None  # the file's keys are not revocable there
    keys.read()  # read again (unchanged)
    assert keys.lookup(MADE) is not None


def test_the_watch_counts_an_unchanged_read_as_fresh_and_a_failed_one_as_not() -> None:
    clock = Clock()
    keys = registry(clock)
    keys.replace(1, made())
    replies: list[Any] = [None, OSError("redis down")]

    async def read(version: int | None) -> Any:
        reply = replies.pop(0)
        clock.now += 10  # each read comes 10 s after the last
        if isinstance(reply, Exception):
            stop.set()
            raise reply
        return reply

    stop = asyncio.Event()
    asyncio.run(watch(keys, read, stop))
    # The unchanged read (at 1010) made it fresh; the failed one (at 1020) did not.
    assert clock.now == 1020
    with pytest.raises(KeysUnavailable):
        keys.lookup(MADE)
    clock.now = 1014.5  # 4.5 s after the unchanged read
    assert keys.lookup(MADE) is not None


def test_keys_gone_with_their_registrys_epoch_are_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    keys = registry(clock)
    lost = metrics.KEYS_LOST._value.get()
    keys.replace("epoch-a:3", made())
    keys.replace("epoch-a:4", {})  # revoked through the admin API: nothing to report
    assert "lost" not in caplog.text and metrics.KEYS_LOST._value.get() == lost
    keys.replace("epoch-a:5", made())
    keys.replace("", {})  # the version gone with Redis's data
    assert "were lost" in caplog.text
    assert metrics.KEYS_LOST._value.get() == lost + 1
    assert keys.lookup(MADE) is None


def test_an_admin_change_parses_only_the_records_it_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 32 (low): each admin change made every process parse every key record again
    (90-130 ms of its event loop at 2,000 keys). Unchanged records are kept as parsed."""
    parsed: list[str] = []
    from_data = KeyRecord.from_data.__func__  # type: ignore[attr-defined]

    def counting(cls: type[KeyRecord], data: Any, *, stored: bool = True) -> KeyRecord:
        parsed.append(data["id"])
        return from_data(cls, data, stored=stored)

    monkeypatch.setattr(KeyRecord, "from_data", classmethod(counting))
    keys = registry(Clock())
    records = [{"id": f"{i:032x}", "tenant": f"t{i}", "users": [f"u{i}"]} for i in range(2000)]
    keys.replace("e:1", stored(*records))
    assert len(parsed) == 2000
    parsed.clear()
    new = {"id": "f" * 32, "tenant": "t-new"}
    changed = {**records[7], "users": ["someone-else"]}
    keys.replace("e:2", stored(*records[1:7], changed, *records[8:], new))  # 0 revoked, 7 changed
    assert sorted(parsed) == sorted([changed["id"], new["id"]])
    by_id = {r.id: r for r in keys.records()}
    assert records[0]["id"] not in by_id
    assert by_id[changed["id"]].users == frozenset({"someone-else"})
    assert by_id[new["id"]].tenant == "t-new"
    assert by_id[records[1]["id"]].tenant == "t1"
