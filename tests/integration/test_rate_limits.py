"""Rate limits against a real Redis and real gateways over HTTP: 429 with Retry-After,
one limit shared by two gateways, requests in flight held by slow streams, keys and
tenants apart, Redis down (``redis.on_failure``), prompt tokens reserved before they are
forwarded and settled after (every proxied endpoint), and a client address's limits
across the keys it rotates."""

from __future__ import annotations

import asyncio
import secrets
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess, ServerThread, running_redis
from gateway.auth.authenticator import Caller, key_id
from gateway.config import parse_settings
from gateway.errors import TooManyRequests
from gateway.http.limit_policy import LimitPolicy
from gateway.http.rate_limits import REFUSAL_MEMO_S, RateLimiter
from gateway.service.ports import LimitStore
from gateway.store.limits import Group
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
    memory: str | None = None,
    client: httpx.Client | None = None,
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if session is not None:
        headers["X-Session-Id"] = session
    if memory is not None:
        headers["X-Memory-Mode"] = memory
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    post = httpx.post if client is None else client.post
    return post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=10)


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

    async def admit(self, groups: Sequence[Group], window: int) -> list[list[Any]]:
        self.admissions += 1
        return await self.limits.admit(groups, window)

    async def reserve(self, groups: Sequence[Group], window: int) -> list[list[Any]]:
        return await self.limits.reserve(groups, window)

    async def release(
        self,
        lease_id: str,
        *,
        in_flight: Sequence[str],
        charged: Sequence[str],
        window: int,
        tokens: int,
        ttl_s: int,
        uncounted: Sequence[str] = (),
    ) -> None:
        await self.limits.release(
            lease_id,
            in_flight=in_flight,
            charged=charged,
            window=window,
            tokens=tokens,
            ttl_s=ttl_s,
            uncounted=uncounted,
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
    lease.took(60)
    await limiter._release(lease)
    second = await limiter.admit(caller)  # 60 + 1 <= 100: still room
    assert second is not None
    second.measured = True
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
    # And its MCP server: refused before the SDK reads the call.
    tools = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    accept = "application/json, text/event-stream"
    mcp = httpx.post(
        gateway.url + "/mcp",
        json=tools,
        headers={"Authorization": f"Bearer {api_key}", "Accept": accept},
    )
    assert_refused(mcp, "requests")
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


# --- prompt tokens reserved before they go, settled after ---

# 1,400 tokens by the gateway's count, and about as many by its length (5.5 KB).
PROMPT = " ".join(f"word{i}" for i in range(700))


async def test_reservations_are_checked_and_taken_in_one_step(store: RedisStore) -> None:
    clock = Clock(6000 * 60.0)
    limiter, caller = _limiter(store, clock, tokens_per_minute=3000)
    leases = [await limiter.admit(caller) for _ in range(20)]
    results = await asyncio.gather(
        *(limiter.reserve(lease, 1400) for lease in leases if lease is not None),
        return_exceptions=True,
    )
    assert results.count(None) == 2  # 2,800 of 3,000: a third would pass the limit
    refused = [r for r in results if isinstance(r, TooManyRequests)]
    assert len(refused) == 18
    error = refused[0].body()["error"]
    assert error["type"] == "tokens"
    assert "Limit 3000, Used 2800, Requested 1400." in error["message"]


async def test_settling_charges_what_the_answer_took(store: RedisStore) -> None:
    clock = Clock(7000 * 60.0 + 50)
    limiter, caller = _limiter(store, clock, tokens_per_minute=3000)
    first, second = await limiter.admit(caller), await limiter.admit(caller)
    assert first is not None and second is not None
    await limiter.reserve(first, 2000)
    with pytest.raises(TooManyRequests):
        await limiter.reserve(second, 1500)  # 2,000 + 1,500
    # The answer took 100: 1,900 given back (to the minute reserved in, settled in the
    # next), and the second prompt fits.
    clock.now += 15
    first.took(100)
    await limiter._release(first)
    await limiter.reserve(second, 1500)
    # An answer that says nothing of what it took: its reservation stands.
    await limiter._release(second)
    third = await limiter.admit(caller)
    assert third is not None
    with pytest.raises(TooManyRequests):
        await limiter.reserve(third, 1500)  # 100 * 0.92 + 1,500 + 1,500
    # One that took more than reserved is charged the rest.
    third.took(1200)
    await limiter._release(third)
    fourth = await limiter.admit(caller)
    assert fourth is not None
    with pytest.raises(TooManyRequests):
        await limiter.reserve(fourth, 400)  # ~92 + 1,500 + 1,200 + 400


async def test_a_prompt_larger_than_the_budget_is_served_alone(store: RedisStore) -> None:
    clock = Clock(8000 * 60.0)
    limiter, caller = _limiter(store, clock, tokens_per_minute=1000)
    big, small = await limiter.admit(caller), await limiter.admit(caller)
    assert big is not None and small is not None
    await limiter.reserve(big, 50_000)  # into an empty minute
    assert big.reserved == 1000  # reserving more would refuse nothing more
    with pytest.raises(TooManyRequests) as refused:
        await limiter.reserve(small, 10)
    assert refused.value.retry_after_s > 60  # the next minute still weighs it


@pytest.mark.parametrize("session", [True, False], ids=["memory-turn", "no-session"])
def test_twenty_requests_at_once_forward_no_more_than_the_minutes_tokens(
    make_gateway: GatewayFactory, api_key: str, fake_upstream: FakeUpstream, session: bool
) -> None:
    gateway = make_gateway(**limited(tokens_per_minute=3000))
    start = threading.Barrier(20)
    answers: list[httpx.Response] = []

    def one() -> None:
        start.wait(10)
        named = f"sess-{uuid.uuid4().hex[:12]}" if session else None
        # The upstream waits 3 s before it answers: all 20 are in flight at once.
        answers.append(chat(gateway, api_key, session=named, model="slow-first-byte", text=PROMPT))

    threads = [threading.Thread(target=one) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    served = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code != 200]
    assert 1 <= len(served) <= 2, [a.status_code for a in answers]
    assert len(refused) == 20 - len(served)
    for answer in refused:
        assert_refused(answer, "tokens")
        assert answer.headers["x-ratelimit-limit-tokens"] == "3000"
        assert answer.headers["x-ratelimit-remaining-tokens"] == "0"
    forwarded = [r for r in fake_upstream.proxied_requests() if r.path == "/v1/chat/completions"]
    assert len(forwarded) == len(served)  # at most ~3,000 tokens' worth went upstream


def _embeddings(gateway: ServerThread, key: str) -> httpx.Response:
    body = {"model": "fake-embed", "input": "hello there my friend"}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(gateway.url + "/v1/embeddings", json=body, headers=headers, timeout=10)


@pytest.mark.parametrize("kind", ["memory-off", "no-session", "embeddings"])
def test_every_proxied_request_is_charged(
    make_gateway: GatewayFactory,
    api_key: str,
    session_id: str,
    fake_upstream: FakeUpstream,
    kind: str,
) -> None:
    # Chat answers say they took 15 tokens; the embeddings answer says nothing, and its
    # prompt (its body's bytes, 4 a token) stays charged.
    gateway = make_gateway(**limited(tokens_per_minute=40))
    sends = {
        "memory-off": lambda: chat(gateway, api_key, session=session_id, memory="off"),
        "no-session": lambda: chat(gateway, api_key),
        "embeddings": lambda: _embeddings(gateway, api_key),
    }
    statuses = []
    for _ in range(8):
        answer = sends[kind]()
        statuses.append(answer.status_code)
        if answer.status_code == 429:
            break
    assert statuses[-1] == 429, statuses  # the minute's 40 tokens are used up
    assert 2 <= len(statuses) <= 4, statuses
    assert_refused(answer, "tokens")
    assert len(fake_upstream.proxied_requests()) == statuses.count(200)


def test_an_answer_smaller_than_its_reservation_gives_the_rest_back(
    make_gateway: GatewayFactory, api_key: str, fake_upstream: FakeUpstream
) -> None:
    gateway = make_gateway(**limited(tokens_per_minute=3000))
    held: list[httpx.Response] = []

    def slow() -> None:
        held.append(chat(gateway, api_key, model="slow-first-byte", text=PROMPT))

    threads = [threading.Thread(target=slow) for _ in range(2)]
    for thread in threads:
        thread.start()
    # Two prompts of 1,400 tokens in flight hold the minute's budget: a third waits.
    wait_for(lambda: len(fake_upstream.in_flight) == 2, 5.0)
    assert_refused(chat(gateway, api_key, text=PROMPT), "tokens")
    for thread in threads:
        thread.join(10)
    assert [a.status_code for a in held] == [200, 200]
    # Their answers said they took 15 tokens each: the rest is given back, and a third
    # prompt fits in the same minute.
    wait_for(lambda: chat(gateway, api_key, text=PROMPT).status_code == 200, 5.0)


# --- a client address's limits, whatever key it sends ---


@pytest.fixture
def own_redis() -> Iterator[RedisProcess]:
    # Not the suite's Redis: every test's requests come from 127.0.0.1, one address.
    with running_redis() as server:
        yield server


@pytest.mark.parametrize("mode", ["forward", "keys"])
def test_rotating_keys_share_their_addresss_limits(
    make_gateway: GatewayFactory, own_redis: RedisProcess, mode: str
) -> None:
    address = {"requests_per_minute": 3}
    keys = [new_key() for _ in range(5)]  # each a fresh tenant
    if mode == "forward":
        overrides: dict[str, Any] = {"limits": {"address": address}}
    else:
        tenants = [{"key": key, "tenant": f"team-{n}"} for n, key in enumerate(keys)]
        overrides = {
            "upstream": {"api_key": OPERATOR_KEY},
            "auth": {"mode": "keys", "keys": tenants},
            "limits": {"address": address, "tenant": {"requests_per_minute": 100}},
        }
    gateway = make_gateway(own_redis.url, **overrides)
    answers = [chat(gateway, key) for key in keys]
    assert [a.status_code for a in answers[:3]] == [200, 200, 200]
    for answer in answers[3:]:
        assert_refused(answer, "requests")
        assert "for this address" in answer.json()["error"]["message"]


def test_a_request_one_scope_refuses_is_not_counted_by_the_other(
    make_gateway: GatewayFactory, own_redis: RedisProcess, api_key: str
) -> None:
    gateway = make_gateway(
        own_redis.url,
        limits={"tenant": {"requests_per_minute": 3}, "address": {"requests_per_minute": 2}},
    )
    assert [chat(gateway, api_key).status_code for _ in range(2)] == [200, 200]
    refused = chat(gateway, api_key)
    assert_refused(refused, "requests")
    assert "for this address" in refused.json()["error"]["message"]
    # From another address (its own limits), the tenant has one request left of its 3:
    # the one its address refused was taken off the tenant's count.
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2")) as other:
        wait_for(lambda: chat(gateway, api_key, client=other).status_code == 200, 5.0)
        again = chat(gateway, api_key, client=other)
    assert_refused(again, "requests")
    assert "for this tenant" in again.json()["error"]["message"]


def test_on_a_redis_cluster_an_address_and_its_tenants_are_checked_at_once(
    make_gateway: GatewayFactory, on_cluster: Any
) -> None:
    # The address's counters are in another slot than each tenant's: a script call each,
    # one round trip (admitting, and reserving the prompt's tokens).
    overrides, a, b = keys_mode(
        tenant={"tokens_per_minute": 100_000},
        address={"requests_per_minute": 3, "tokens_per_minute": 100_000, "concurrent": 5},
    )
    gateway = make_gateway(on_cluster.url, **overrides)
    assert [chat(gateway, key).status_code for key in (a, b, a)] == [200, 200, 200]
    refused = chat(gateway, b)
    assert_refused(refused, "requests")
    assert "for this address" in refused.json()["error"]["message"]
