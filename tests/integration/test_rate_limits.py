"""Rate limits against a real Redis and real gateways over HTTP: 429 with Retry-After,
one limit shared by two gateways, requests in flight held by slow streams, keys and
tenants apart, and Redis down (``redis.on_failure``)."""

from __future__ import annotations

import secrets
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess, ServerThread
from gateway.auth.authenticator import Caller, key_id
from gateway.config import parse_settings
from gateway.errors import TooManyRequests
from gateway.http.rate_limits import REFUSAL_MEMO_S, LimitPolicy, RateLimiter
from gateway.service.ports import LimitStore
from gateway.store.redis_store import RedisStore
from tests.support.fixtures import USED_KEYS, GatewayFactory
from tests.support.waiting import wait_for

OPERATOR_KEY = "sk-operator-" + secrets.token_urlsafe(16)
USED_KEYS.append(OPERATOR_KEY)


def new_key() -> str:
    key = "mg-test-" + secrets.token_urlsafe(24)
    USED_KEYS.append(key)
    return key


def chat(
    gateway: ServerThread,
    key: str,
    *,
    session: str | None = None,
    model: str = "fake-model",
    text: str = "hello there",
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if session is not None:
        headers["X-Session-Id"] = session
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=10)


def assert_refused(response: httpx.Response, kind: str) -> int:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["type"] == kind
    assert error["code"] == "rate_limit_exceeded"
    retry_after = int(response.headers["retry-after"])
    assert 1 <= retry_after <= 120
    return retry_after


def limited(**tenant: int) -> dict[str, Any]:
    return {"limits": {"tenant": tenant}}


def keys_mode(**limits: Any) -> tuple[dict[str, Any], str, str]:
    """Settings overrides for two gateway keys of one tenant, and the two keys."""
    a, b = new_key(), new_key()
    overrides = {
        "upstream": {"api_key": OPERATOR_KEY},
        "auth": {
            "mode": "keys",
            "keys": [
                {"key": a, "tenant": "team-" + uuid.uuid4().hex[:8]},
                {"key": b, "tenant": "team-" + uuid.uuid4().hex[:8]},
            ],
        },
        "limits": limits,
    }
    return overrides, a, b


# --- the admission script itself, on a clock the test sets ---


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class CountedLimits:
    """The store's rate-limit counters, counting the admissions asked of Redis."""

    def __init__(self, limits: LimitStore) -> None:
        self.limits = limits
        self.admissions = 0

    async def admit(self, scopes: Sequence[str], window: int, args: Sequence[Any]) -> list[Any]:
        self.admissions += 1
        return await self.limits.admit(scopes, window, args)

    async def release(
        self,
        lease_id: str,
        *,
        in_flight: Sequence[str],
        charged: Sequence[str],
        window: int,
        tokens: int,
        ttl_s: int,
    ) -> None:
        await self.limits.release(
            lease_id,
            in_flight=in_flight,
            charged=charged,
            window=window,
            tokens=tokens,
            ttl_s=ttl_s,
        )


def _limiter(
    store: RedisStore | LimitStore, clock: Clock, **tenant: int
) -> tuple[RateLimiter, Caller]:
    settings = parse_settings(limited(**tenant), environ={})
    limits = store.limits if isinstance(store, RedisStore) else store
    limiter = RateLimiter(limits, LimitPolicy(settings), lease_s=600, fail_closed=True, clock=clock)
    name = "sk-script-" + uuid.uuid4().hex
    return limiter, Caller("", key_id(name), None, None, True, None, name)


async def test_the_window_slides_and_retry_after_is_when_it_has_room(store: RedisStore) -> None:
    # Minute 1000 of the epoch: 3 requests at its start fill a limit of 3.
    clock = Clock(1000 * 60.0)
    limiter, caller = _limiter(store, clock, requests_per_minute=3)
    for _ in range(3):
        assert await limiter.admit(caller) is not None
    clock.now += 30
    with pytest.raises(TooManyRequests) as refused:
        await limiter.admit(caller)
    # This minute alone is full: the next one, until 3 * (1 - f) + 1 <= 3 (f = 1/3).
    assert refused.value.retry_after_s == 30 + 20
    clock.now = 1001 * 60.0 + 1  # the next minute: the previous 3 still weigh 2.95
    with pytest.raises(TooManyRequests) as again:
        await limiter.admit(caller)
    assert again.value.retry_after_s == 19
    clock.now += 18.5  # just short of it
    with pytest.raises(TooManyRequests):
        await limiter.admit(caller)
    clock.now += 0.5  # 20 s in: 3 * 40/60 = 2, room for one
    assert await limiter.admit(caller) is not None
    with pytest.raises(TooManyRequests):
        await limiter.admit(caller)


async def test_a_refused_request_is_not_counted(store: RedisStore) -> None:
    clock = Clock(2000 * 60.0)
    limiter, caller = _limiter(store, clock, requests_per_minute=2, concurrent=1)
    lease = await limiter.admit(caller)
    assert lease is not None
    for _ in range(5):  # refused for the one in flight: the minute's count stays 1
        with pytest.raises(TooManyRequests):
            await limiter.admit(caller)
    await limiter._release(lease)
    assert await limiter.admit(caller) is not None  # the second of the minute


async def test_a_caller_refused_a_moment_ago_is_refused_without_a_round_trip(
    store: RedisStore,
) -> None:
    clock = Clock(2500 * 60.0)
    counted = CountedLimits(store.limits)
    limiter, caller = _limiter(counted, clock, concurrent=1)
    assert await limiter.admit(caller) is not None
    for _ in range(5):
        with pytest.raises(TooManyRequests):
            await limiter.admit(caller)
    assert counted.admissions == 2  # the admission and the first refusal; the rest were local
    clock.now += REFUSAL_MEMO_S
    with pytest.raises(TooManyRequests):
        await limiter.admit(caller)
    assert counted.admissions == 3  # the refusal is asked again once its moment has passed


async def test_a_crashed_processs_lease_lapses(store: RedisStore) -> None:
    clock = Clock(3000 * 60.0)
    limiter, caller = _limiter(store, clock, concurrent=1)
    assert await limiter.admit(caller) is not None  # never released: its process died
    clock.now += 599
    with pytest.raises(TooManyRequests) as refused:
        await limiter.admit(caller)
    assert refused.value.body()["error"]["type"] == "requests"
    clock.now += 2  # past limits.lease_s
    assert await limiter.admit(caller) is not None


async def test_tokens_are_charged_on_release(store: RedisStore) -> None:
    clock = Clock(4000 * 60.0)
    limiter, caller = _limiter(store, clock, tokens_per_minute=100)
    lease = await limiter.admit(caller)
    assert lease is not None
    lease.tokens = 60
    await limiter._release(lease)
    second = await limiter.admit(caller)  # 60 + 1 <= 100: still room
    assert second is not None
    second.pending.append(lambda: 50)  # counted only when released
    await limiter._release(second)
    with pytest.raises(TooManyRequests) as refused:
        await limiter.admit(caller)
    assert refused.value.body()["error"]["type"] == "tokens"
    assert refused.value.response_headers()["x-ratelimit-limit-tokens"] == "100"


async def test_a_redis_that_lost_its_scripts_is_given_it_again(store: RedisStore) -> None:
    clock = Clock(5000 * 60.0)
    limiter, caller = _limiter(store, clock, requests_per_minute=5)
    await store.client.script_flush()
    assert await limiter.admit(caller) is not None
    assert await limiter.admit(caller) is not None


# --- over HTTP ---


def test_over_the_limit_a_429_with_retry_after_and_another_tenant_is_served(
    make_gateway: GatewayFactory, api_key: str, session_id: str, fake_upstream: FakeUpstream
) -> None:
    gateway = make_gateway(**limited(requests_per_minute=3))
    for _ in range(3):
        assert chat(gateway, api_key, session=session_id).status_code == 200
    refused = chat(gateway, api_key, session=session_id)
    assert_refused(refused, "requests")
    assert refused.headers["x-ratelimit-limit-requests"] == "3"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-gateway-request-id"]  # counted and logged as any request
    assert len(fake_upstream.proxied_requests()) == 3  # the refused one never went upstream
    # The passthrough and the memory API count too.
    models = httpx.get(
        gateway.url + "/v1/models", headers={"Authorization": f"Bearer {api_key}"}, timeout=10
    )
    assert_refused(models, "requests")
    sessions = httpx.get(
        gateway.url + "/memory/sessions", headers={"Authorization": f"Bearer {api_key}"}
    )
    assert_refused(sessions, "requests")
    # Another tenant has its own minute.
    other = "sk-test-" + secrets.token_urlsafe(24)
    USED_KEYS.append(other)
    for _ in range(3):
        assert chat(gateway, other, session=session_id).status_code == 200
    # A request without a key is still told so (401), not counted against anyone.
    anonymous = httpx.post(gateway.url + "/v1/chat/completions", json={}, timeout=10)
    assert anonymous.status_code == 401


def test_two_gateways_on_one_redis_enforce_one_limit(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    first = make_gateway(**limited(requests_per_minute=4))
    second = make_gateway(**limited(requests_per_minute=4))
    served = [chat(gw, api_key, session=session_id).status_code for gw in (first, second) * 2]
    assert served == [200, 200, 200, 200]
    assert_refused(chat(first, api_key, session=session_id), "requests")
    assert_refused(chat(second, api_key, session=session_id), "requests")


def test_requests_in_flight_are_limited_until_their_streams_end(
    make_gateway: GatewayFactory, api_key: str
) -> None:
    gateway = make_gateway(**limited(concurrent=2))
    opened = threading.Barrier(3)
    finished: list[int] = []

    def slow_stream() -> None:
        body = {
            "model": "slow-stream",  # five chunks 0.3 s apart
            "stream": True,
            "messages": [{"role": "user", "content": "tell me slowly"}],
        }
        headers = {"Authorization": f"Bearer {api_key}"}
        url = gateway.url + "/v1/chat/completions"
        with httpx.stream("POST", url, json=body, headers=headers, timeout=10) as response:
            assert response.status_code == 200
            opened.wait(5)
            text = response.read().decode()
        assert "[DONE]" in text
        finished.append(response.status_code)

    streams = [threading.Thread(target=slow_stream) for _ in range(2)]
    for thread in streams:
        thread.start()
    opened.wait(5)  # both streams have their headers: both in flight
    third = chat(gateway, api_key)
    assert_refused(third, "requests")
    assert "in flight" in third.json()["error"]["message"]
    assert third.headers["retry-after"] == "1"
    for thread in streams:
        thread.join(10)
    assert finished == [200, 200]
    # Their slots are given back once their last bytes are sent.
    wait_for(lambda: chat(gateway, api_key).status_code == 200, 5.0)


def test_a_client_that_leaves_gives_its_slot_back(
    make_gateway: GatewayFactory, api_key: str
) -> None:
    gateway = make_gateway(**limited(concurrent=1))
    body = {
        "model": "stall-stream",  # two chunks, then silence
        "stream": True,
        "messages": [{"role": "user", "content": "then say nothing"}],
    }
    headers = {"Authorization": f"Bearer {api_key}"}
    url = gateway.url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=10) as response:
        assert response.status_code == 200
        assert_refused(chat(gateway, api_key), "requests")
    # The client closed its connection mid-stream.
    wait_for(lambda: chat(gateway, api_key).status_code == 200, 5.0)


def test_tokens_a_minute_refuse_the_next_request_once_used(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    # The fake upstream's usage: 10 prompt + 5 completion tokens a turn.
    gateway = make_gateway(**limited(tokens_per_minute=30))
    assert chat(gateway, api_key, session=session_id, text="the first turn").status_code == 200
    wait_for(lambda: chat(gateway, api_key, session=session_id).status_code == 429, 5.0)
    refused = chat(gateway, api_key, session=session_id)
    assert_refused(refused, "tokens")
    assert refused.headers["x-ratelimit-limit-tokens"] == "30"


def test_keys_of_one_tenant_have_their_own_limits_and_share_the_tenants(
    make_gateway: GatewayFactory,
) -> None:
    overrides, a, b = keys_mode(tenant={"requests_per_minute": 5}, key={"requests_per_minute": 2})
    keys = overrides["auth"]["keys"]
    keys[1]["tenant"] = keys[0]["tenant"]  # one tenant, two keys
    keys[1]["limits"] = {"requests_per_minute": 3}  # b's own limit
    gateway = make_gateway(**overrides)
    assert [chat(gateway, a).status_code for _ in range(2)] == [200, 200]
    refused = chat(gateway, a)
    assert_refused(refused, "requests")
    assert "for this key" in refused.json()["error"]["message"]
    # b has its own key limit (3), and the tenant's 5 are shared: 2 used by a.
    assert [chat(gateway, b).status_code for _ in range(3)] == [200, 200, 200]
    refused = chat(gateway, b)
    assert_refused(refused, "requests")
    assert "for this tenant" in refused.json()["error"]["message"]


def test_another_tenants_keys_are_not_held_back(make_gateway: GatewayFactory) -> None:
    overrides, a, b = keys_mode(tenant={"requests_per_minute": 2})
    gateway = make_gateway(**overrides)
    assert [chat(gateway, a).status_code for _ in range(2)] == [200, 200]
    assert_refused(chat(gateway, a), "requests")
    assert [chat(gateway, b).status_code for _ in range(2)] == [200, 200]


def test_with_limits_off_nothing_is_counted(
    make_gateway: GatewayFactory, api_key: str, session_id: str, redis_server: RedisProcess
) -> None:
    gateway = make_gateway()
    for _ in range(5):
        assert chat(gateway, api_key, session=session_id).status_code == 200
    client = redis_server.client()
    try:
        # Where this tenant's counters would be (other tests' may be in this Redis).
        policy = LimitPolicy(parse_settings(limited(requests_per_minute=1), environ={}))
        caller = Caller("", key_id(api_key), None, None, True, None, api_key)
        (scope,) = policy.scopes(caller)
        assert list(client.scan_iter(match=scope.prefix + "*", count=1000)) == []
    finally:
        client.close()


@pytest.fixture
def dead_redis_url() -> Iterator[str]:
    server = RedisProcess().start()
    url = server.url
    server.cleanup()  # stopped: nothing listens there now
    yield url


@pytest.mark.parametrize("on_failure", ["open", "closed"])
def test_redis_down_follows_on_failure(
    make_gateway: GatewayFactory, api_key: str, dead_redis_url: str, on_failure: str
) -> None:
    gateway = make_gateway(
        dead_redis_url, redis={"on_failure": on_failure}, **limited(requests_per_minute=1)
    )
    statuses = [chat(gateway, api_key).status_code for _ in range(2)]
    if on_failure == "open":
        assert statuses == [200, 200]  # not counted: served as if unlimited
    else:
        assert statuses == [503, 503]


def test_on_a_redis_cluster_two_gateways_enforce_one_limit(
    make_gateway: GatewayFactory, on_cluster: Any, api_key: str
) -> None:
    overrides, a, _ = keys_mode(
        tenant={"requests_per_minute": 3}, key={"requests_per_minute": 10, "concurrent": 5}
    )
    first = make_gateway(on_cluster.url, **overrides)
    second = make_gateway(on_cluster.url, **overrides)
    served = [chat(gw, a).status_code for gw in (first, second, first)]
    assert served == [200, 200, 200]
    assert_refused(chat(second, a), "requests")
