"""The catalog's indexes in Redis: refreshed at most every ``REFRESH_S`` by a session's
turns, and sessions Redis has expired listed no more and trimmed from them."""

from __future__ import annotations

import httpx

from devsupport.servers import RedisProcess
from gateway.auth.identity import tenant_id
from gateway.store.catalog import REFRESH_S
from gateway.store.keys import TENANT_SECRET_KEY, SessionKeys
from tests.support.clients import Memory, sdk
from tests.support.clock import SteppedClock
from tests.support.fixtures import GatewayFactory
from tests.support.waiting import wait_for


def test_sessions_past_the_retention_leave_the_list_and_the_index(
    make_gateway: GatewayFactory, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(redis={"retention_days": 1.5 / 86400})  # 1 s
    Memory(gateway, api_key, session_id).add(2)
    auth = {"Authorization": f"Bearer {api_key}"}
    client = redis_server.client()
    try:
        with httpx.Client(base_url=gateway.url, headers=auth) as http:
            sessions = http.get("/memory/sessions").json()["sessions"]
            assert [s["session_id"] for s in sessions] == [session_id]
            # Redis's own clock expires the session; the index still lists it until read.
            keys = SessionKeys(tenant_id(client.get(TENANT_SECRET_KEY), api_key), session_id)
            wait_for(lambda: not client.exists(keys.meta), what="Redis expiring the session")
            assert client.zscore(keys.listed_in, session_id) is not None
            assert http.get("/memory/sessions").json()["sessions"] == []
        indexes = list(client.scan_iter(match="mg:{*.i*}:sessions", count=1000))
        assert all(client.zscore(k, session_id) is None for k in indexes)
    finally:
        client.close()


def test_turns_refresh_the_index_at_most_every_few_minutes_but_lists_stay_exact(
    make_gateway: GatewayFactory, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    clock = SteppedClock()
    gateway = make_gateway(clock=clock)
    client = sdk(gateway, api_key, session_id)

    def ask() -> None:
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "a question"}]
        )

    ask()
    redis = redis_server.client()
    try:
        keys = SessionKeys(tenant_id(redis.get(TENANT_SECRET_KEY), api_key), session_id)
        first = redis.zscore(keys.listed_in, session_id)
        assert first is not None and redis.zscore(keys.tenant_listed_in, keys.tenant) == first
        clock.advance(1)
        ask()
        assert redis.zscore(keys.listed_in, session_id) == first  # within REFRESH_S
        assert redis.llen(keys.receipts) == 2  # the receipt is the session's own: every turn
        updated = float(redis.hget(keys.meta, "updated"))
        assert updated > first
        # A turn REFRESH_S after the last one refreshes it.
        redis.hset(keys.meta, "updated", repr(updated - REFRESH_S))
        ask()
        assert redis.zscore(keys.listed_in, session_id) > updated
    finally:
        redis.close()
    auth = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=gateway.url, headers=auth) as http:
        listed = http.get("/memory/sessions").json()["sessions"]
    assert [s["session_id"] for s in listed] == [session_id]
