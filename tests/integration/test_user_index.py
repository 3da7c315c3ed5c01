"""A user's new session costs the same Redis work whether they have 1 session or 10,000:
their idle sessions are found by score in the active index, a batch at a time."""

from __future__ import annotations

from typing import Any

import httpx

from devsupport.servers import running_redis
from gateway.presets import PRESETS
from gateway.store.redis_store import IDLE_BATCH
from gateway.store.sessions import ACTIVE_READ
from tests.support.fixtures import GatewayFactory

SESSIONS = 10_000


def _commands(client: Any) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def test_a_new_session_of_a_user_with_ten_thousand_sessions_costs_a_bounded_redis_work(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    tiers = PRESETS["hybrid-recall"].model_dump(mode="json")
    tiers["cross_session"]["idle_end_s"] = 60
    with running_redis() as redis_server:
        gateway = make_gateway(
            redis_url=redis_server.url,
            memory={"preset": "hybrid-recall", "tiers": tiers},
            worker={"in_process": False},  # the ends stay queued: only the request's work
            # A configured secret: no background write-back of it among the counted calls.
            server={"tenant_secret": "a-tenant-secret-of-this-test"},
        )
        headers = {"Authorization": f"Bearer {api_key}", "X-User-Id": "many-sessions"}
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}]}

        def turn(session: str) -> httpx.Response:
            with httpx.Client(base_url=gateway.url, timeout=30) as http:
                return http.post(
                    "/v1/chat/completions", json=body, headers={**headers, "X-Session-Id": session}
                )

        assert turn(session_id).headers["x-memory-status"] == "ok"
        client = redis_server.client()
        try:
            (active,) = client.keys("*:active")
            index = active.replace(b":active", b":sessions")
            # 10,000 more sessions of the user, long idle (as if made over the months).
            old = {f"old-{i}": 1_000.0 + i for i in range(SESSIONS)}
            client.zadd(active, old)
            client.sadd(index, *old)
            client.config_resetstat()

            assert turn(session_id + "-new").headers["x-memory-status"] == "ok"

            calls = _commands(client)
            assert "smembers" not in calls and "hmget" not in calls
            # The load (with the user's latest active sessions, for recall: ACTIVE_READ
            # of them, ~10 commands each), the record (and the quota's hold and
            # settlement, in their scripts) and one batch of ends (each: its job in the
            # session's jobs hash and job order, each with its expiry, and a notice):
            # hundreds of commands, not tens of thousands.
            bound = 70 + 5 * IDLE_BATCH + 12 * ACTIVE_READ
            assert sum(calls.values()) < bound, sorted(calls.items())
            # The oldest IDLE_BATCH sessions are being ended (and left the active index);
            # the new one joined it.
            assert client.zcard(active) == SESSIONS + 2 - IDLE_BATCH
            assert client.zscore(active, "old-0") is None
            assert client.zscore(active, f"old-{IDLE_BATCH}") is not None
            assert client.zscore(active, session_id + "-new") is not None
        finally:
            client.close()
