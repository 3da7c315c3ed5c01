"""What the upstream says it cached, end to end: the real OpenAI SDK → gateway → the fake
upstream (its ``cached-prompt`` model reports ``cached_tokens``), real Redis. Each turn's
usage lands in its stored receipt, the prompt and cached counters of ``/metrics`` and the
inspector's recent requests, beside the gateway's own prediction (``stable_tokens``)."""

from __future__ import annotations

import re
from typing import Any

import httpx

from devsupport.fake_responses import CACHED_TOKENS
from devsupport.servers import RedisProcess
from gateway.auth.identity import tenant_id
from gateway.store.keys import TENANT_SECRET_KEY
from tests.support.clients import Memory, register_content, sdk
from tests.support.fixtures import GatewayFactory
from tests.support.metrics import moved, scrape

ADMIN_KEY = "admin-" + "u" * 24
PROMPT = "memory_gateway_upstream_prompt_tokens_total"
CACHED = "memory_gateway_upstream_cached_tokens_total"
STABLE = "memory_gateway_context_stable_tokens_total"


def usage(prompt: int | None, cached: int | None, completion: int | None) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "cached_tokens": cached, "completion_tokens": completion}


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": register_content(text)}]


def test_the_upstreams_cached_tokens_reach_the_receipt_the_metrics_and_the_inspector(
    make_gateway: GatewayFactory, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    # The prefix policy predicts whatever a turn shares with the last: small contexts too.
    gateway = make_gateway(
        upstream={"prompt_cache": {"policy": "prefix"}},
        ui={"enabled": True, "admin_key": ADMIN_KEY},
    )
    client = sdk(gateway, api_key, session_id)
    before = scrape(gateway.url)

    chat = client.chat.completions
    chat.create(model="cached-prompt", messages=user("a whole chat answer, please"))
    streamed = chat.create(
        model="cached-prompt",
        messages=user("a streamed chat answer with its usage"),
        stream=True,
        stream_options={"include_usage": True},
    )
    relayed = [c.usage.prompt_tokens_details for c in streamed if c.usage]
    assert [d.cached_tokens if d else None for d in relayed] == [CACHED_TOKENS]  # untouched
    # A stream the client asked no usage for carries none: nothing to read.
    for _ in chat.create(
        model="cached-prompt", messages=user("a stream without usage"), stream=True
    ):
        pass
    # An upstream that reports no cache at all.
    chat.create(model="fake-model", messages=user("an upstream that says nothing of caching"))
    client.responses.create(model="cached-prompt", input=register_content("a whole response"))
    for _ in client.responses.create(
        model="fake-model", input=register_content("a streamed response"), stream=True
    ):
        pass

    after = scrape(gateway.url)
    memory = Memory(gateway, api_key, session_id)
    receipts = memory.http.get(memory.base + "/receipts").json()["receipts"]
    assert [r["usage"] for r in reversed(receipts)] == [
        usage(10, CACHED_TOKENS, 5),
        usage(10, CACHED_TOKENS, 5),
        usage(None, None, None),
        usage(10, None, 5),
        usage(10, CACHED_TOKENS, 5),
        usage(10, 0, 5),  # the Responses fake reports 0 cached by default
    ]
    # The upstream's own numbers, summed over the turns that reported them.
    assert moved(before, after, PROMPT) == 5 * 10
    assert moved(before, after, CACHED) == 3 * CACHED_TOKENS
    # The gateway's prediction, summed over the turns that had one (all but the first).
    stable = [r["receipt"]["stable_tokens"] for r in receipts]
    predicted = sum(s for s in stable if s is not None)
    assert stable[-1] is None and predicted > 0
    assert moved(before, after, STABLE) == predicted

    # The inspector: each request's numbers, and the hit rate over those that said both.
    redis = redis_server.client()
    try:
        secret = redis.get(TENANT_SECRET_KEY)
    finally:
        redis.close()
    assert isinstance(secret, bytes)
    tenant = tenant_id(secret, api_key)
    page = httpx.get(
        gateway.url + "/ui/session",
        params={"tenant": tenant, "id": session_id},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=10,
    )
    assert page.status_code == 200, page.text

    def column(name: str) -> list[str]:
        return re.findall(rf'<td class="num {name}">([^<]*)</td>', page.text)

    assert column("prompt") == ["10", "10", "10", "—", "10", "10"]
    assert column("cached") == ["0", str(CACHED_TOKENS), "—", "—", *[str(CACHED_TOKENS)] * 2]
    assert column("stable") == ["—" if s is None else str(s) for s in stable]
    cached = 3 * CACHED_TOKENS
    assert f'id="hit-rate-percent">{round(100 * cached / 40, 1)}%<' in page.text
    assert f'id="hit-rate-cached">{cached}<' in page.text
    assert 'id="hit-rate-prompt">40<' in page.text
