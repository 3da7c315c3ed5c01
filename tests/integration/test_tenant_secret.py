"""The tenant secret kept in Redis (``server.tenant_secret: null``, the default) survives
Redis losing its data (issue 32, finding 6: a process started after the loss made a new
secret, so one key named two tenants; a DELETE through the new process answered 204
while the old one kept serving the session).

Every process writes its secret back where Redis lost it (``Tenants.keep``, every
``auth.refresh_s``), and adopts Redis's when another process made a new one first. On a
private Redis of this module: each test flushes it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from devsupport.servers import RedisProcess
from gateway.auth.tenancy import Tenants
from gateway.observability import metrics
from gateway.store.keys import TENANT_SECRET_KEY
from gateway.store.redis_store import RedisStore, create_client
from tests.support.clients import register_content
from tests.support.fixtures import GatewayFactory
from tests.support.waiting import reached, wait_for

KEY = "sk-tenant-secret-test-key"  # a name to hash (never sent anywhere)


@pytest.fixture
async def stores(private_redis: RedisProcess) -> AsyncIterator[list[RedisStore]]:
    """Two stores on one Redis: the links of two gateway processes."""
    opened = [
        RedisStore(
            create_client(private_redis.url, timeout_s=2, max_connections=2),
            timeout_s=2,
            retention_s=3600,
        )
        for _ in range(2)
    ]
    yield opened
    for store in opened:
        await store.close()


async def test_a_process_writes_its_secret_back_after_redis_loses_it(
    admin: Any, stores: list[RedisStore]
) -> None:
    old = Tenants(stores[0].server, None)
    before = await old.tenant_for(KEY)
    admin.flushall()  # Redis restarted empty
    await old.keep()  # the old process's next turn
    assert admin.get(TENANT_SECRET_KEY) is not None
    new = Tenants(stores[1].server, None)  # a process started after the loss
    await new.load()
    assert await new.tenant_for(KEY) == before == await old.tenant_for(KEY)


async def test_processes_agree_again_when_a_new_one_made_a_secret_first(
    admin: Any, stores: list[RedisStore], caplog: pytest.LogCaptureFixture
) -> None:
    old = Tenants(stores[0].server, None)
    before = await old.tenant_for(KEY)
    admin.flushall()
    new = Tenants(stores[1].server, None)  # started before the old one's next turn
    made = await new.tenant_for(KEY)
    assert made != before  # a new secret: one key, two tenants, for now
    replaced = metrics.TENANT_SECRET_REPLACED._value.get()
    with caplog.at_level(logging.ERROR, logger="gateway.auth.tenancy"):
        await old.keep()
    assert await old.tenant_for(KEY) == made == await new.tenant_for(KEY)
    assert metrics.TENANT_SECRET_REPLACED._value.get() == replaced + 1
    assert "server.tenant_secret" in caplog.text
    await old.keep()  # agreed: nothing more to report
    assert metrics.TENANT_SECRET_REPLACED._value.get() == replaced + 1


async def test_a_configured_secret_is_never_written_to_redis(
    admin: Any, stores: list[RedisStore]
) -> None:
    configured = Tenants(stores[0].server, "a-configured-secret-of-the-operator")
    await configured.keep()
    await configured.tenant_for(KEY)
    assert admin.get(TENANT_SECRET_KEY) is None


def test_an_erasure_through_a_process_started_after_the_loss_is_seen_by_the_old_one(
    admin: Any,
    private_redis: RedisProcess,
    make_gateway: GatewayFactory,
    api_key: str,
    session_id: str,
) -> None:
    """The finding, end to end: an old gateway, Redis flushed, a new gateway started; a
    session recorded through the old one and erased through the new one is gone on both."""
    fast = {"auth": {"refresh_s": 0.05}}
    old = make_gateway(redis_url=private_redis.url, **fast)
    headers = {"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id}
    with httpx.Client(base_url=old.url, headers=headers, timeout=30) as via_old:
        assert via_old.get(f"/memory/sessions/{session_id}").status_code == 404  # secret read
        admin.flushall()
        # The old gateway's next turn writes its secret back (before issue 32's fix nothing
        # did, and the new gateway made another: the erasure below missed the session).
        reached(lambda: admin.get(TENANT_SECRET_KEY) is not None, timeout=5)
        new = make_gateway(redis_url=private_redis.url, **fast)
        text = register_content("a note recorded after the flush, then erased")
        body = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
        answer = via_old.post("/v1/chat/completions", json=body)
        assert answer.headers["x-memory-status"] == "ok"
        assert via_old.get(f"/memory/sessions/{session_id}").status_code == 200
        with httpx.Client(base_url=new.url, headers=headers, timeout=30) as via_new:
            assert via_new.get(f"/memory/sessions/{session_id}").status_code == 200
            assert via_new.delete(f"/memory/sessions/{session_id}").status_code == 204
        assert via_old.get(f"/memory/sessions/{session_id}").status_code == 404


def test_an_old_gateway_adopts_the_secret_a_new_one_made_and_serves_its_sessions(
    admin: Any,
    private_redis: RedisProcess,
    make_gateway: GatewayFactory,
    api_key: str,
    session_id: str,
) -> None:
    """The race the write-back cannot close: a new gateway makes a secret before the old
    one restores its own. The old one adopts it within ``auth.refresh_s``: both name the
    key's tenant alike, and a session recorded through the new one is the old one's too."""
    headers = {"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id}
    old = make_gateway(redis_url=private_redis.url, auth={"refresh_s": 0.2})
    with httpx.Client(base_url=old.url, headers=headers, timeout=30) as via_old:
        assert via_old.get(f"/memory/sessions/{session_id}").status_code == 404  # secret read
        replaced = metrics.TENANT_SECRET_REPLACED._value.get()
        admin.flushall()
        # What a gateway starting in that moment does (made here, so that the old one's
        # next turn cannot come first): a new secret in Redis.
        admin.set(TENANT_SECRET_KEY, "a-secret-made-by-a-newer-gateway")
        new = make_gateway(redis_url=private_redis.url)
        text = register_content("a note recorded through the newest gateway")
        body = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
        with httpx.Client(base_url=new.url, headers=headers, timeout=30) as via_new:
            answer = via_new.post("/v1/chat/completions", json=body)
            assert answer.headers["x-memory-status"] == "ok"
        wait_for(
            lambda: metrics.TENANT_SECRET_REPLACED._value.get() > replaced,
            timeout=10,
            what="the old gateway adopting the new secret",
        )
        found = via_old.get(f"/memory/sessions/{session_id}")
        assert found.status_code == 200
        assert text in found.text
