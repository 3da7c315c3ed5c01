"""Sessions Redis has expired leave the catalog: listed no more, and trimmed from it."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.integration.conftest import GatewayFactory, Memory
from tests.support.servers import RedisProcess

pytestmark = pytest.mark.integration


def test_sessions_past_the_retention_leave_the_list_and_the_index(
    make_gateway: GatewayFactory, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(redis={"retention_days": 1.5 / 86400})  # 1 s
    Memory(gateway, api_key, session_id).add(2)
    auth = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=gateway.url, headers=auth) as http:
        sessions = http.get("/memory/sessions").json()["sessions"]
        assert [s["session_id"] for s in sessions] == [session_id]
        time.sleep(2.1)
        assert http.get("/memory/sessions").json()["sessions"] == []
    client = redis_server.client()
    try:
        indexes = list(client.scan_iter(match="mg:{*.i*}:sessions", count=1000))
        assert all(client.zscore(k, session_id) is None for k in indexes)
    finally:
        client.close()
