"""One tenant cannot take the upstream pool (``upstream.tenant_share``): its streams past
its share get 429 while another tenant's requests are still served, over HTTP, with a
real gateway and a fake upstream whose streams stall."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx

from devsupport.servers import ServerThread
from tests.support.fixtures import GatewayFactory
from tests.support.waiting import wait_for

STALL = {
    "model": "stall-stream",  # two chunks, then silence
    "stream": True,
    "messages": [{"role": "user", "content": "then say nothing"}],
}


@contextlib.contextmanager
def held_streams(gateway: ServerThread, key: str, count: int) -> Iterator[list[int]]:
    """``count`` streams opened and held (their statuses), closed on leaving."""
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(httpx.Client(timeout=10))
        statuses = []
        for _ in range(count):
            response = stack.enter_context(
                client.stream(
                    "POST",
                    gateway.url + "/v1/chat/completions",
                    json=STALL,
                    headers={"Authorization": f"Bearer {key}"},
                )
            )
            statuses.append(response.status_code)
            if response.status_code != 200:
                response.read()
        yield statuses


def chat(gateway: ServerThread, key: str) -> httpx.Response:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(
        gateway.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )


def test_one_tenant_cannot_take_the_upstream_pool(
    make_gateway: GatewayFactory, api_key: str
) -> None:
    gateway = make_gateway(upstream={"max_connections": 8, "tenant_share": 0.25})
    other = api_key + "-other"  # another tenant (forward mode: another key)
    with held_streams(gateway, api_key, 7) as statuses:
        # Six held (all but a share of 2), the seventh refused at once.
        assert statuses == [200] * 6 + [429]
        refused = chat(gateway, api_key)
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["code"] == "rate_limit_exceeded"
        assert "in flight for this tenant" in error["message"]
        assert refused.headers["retry-after"] == "1"
        # Another tenant is served from the share kept free.
        assert chat(gateway, other).status_code == 200
    # The streams closed: their slots are given back.
    wait_for(lambda: chat(gateway, api_key).status_code == 200, 5.0)


def test_a_whole_share_lets_one_tenant_take_the_pool(
    make_gateway: GatewayFactory, api_key: str
) -> None:
    gateway = make_gateway(upstream={"max_connections": 8, "tenant_share": 1})
    with held_streams(gateway, api_key, 7) as statuses:
        assert statuses == [200] * 7
