"""Which of a client's request headers reach the upstream, as a real upstream receives them.

Only an allowlist crosses (what the OpenAI SDKs send): a client's other credentials
(``api-key``, ``x-api-key``), its cookies, what earlier proxies said of it
(``X-Forwarded-For``, ``Forwarded``) and anything else stay at the gateway, on the memory
route (chat and Responses, streamed or not) and on the passthrough alike. Before, all of
these went upstream, in keys mode beside the operator's key.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from devsupport.fake_upstream import FakeUpstream, SeenRequest
from devsupport.servers import ServerThread
from tests.support.fixtures import GatewayFactory
from tests.support.waiting import wait_for

CLIENT_KEY = "sk-forwarded-headers-client-0123"
GATEWAY_KEY = "gw-key-forwarded-headers-0123"
OPERATOR_KEY = "sk-operator-forwarded-headers"
# What the OpenAI Python SDK sends beside its key (and the account it names).
SDK = {
    "Accept": "application/json",
    "User-Agent": "OpenAI/Python 1.99.0",
    "X-Stainless-Lang": "python",
    "X-Stainless-OS": "Linux",
    "X-Stainless-Retry-Count": "0",
    "OpenAI-Beta": "assistants=v2",
    "Idempotency-Key": "stainless-python-retry-7",
}
ACCOUNT = {"OpenAI-Organization": "org-client", "OpenAI-Project": "proj-client"}
NEVER = {
    "api-key": "azure-style-secret",
    "x-api-key": "anthropic-style-secret",
    "Cookie": "session=cookie-secret",
    "X-Forwarded-For": "10.1.2.3",
    "Forwarded": "for=10.1.2.3;proto=http",
    "X-Real-IP": "10.1.2.3",
    "X-Custom-Secret": "custom-secret",
    "Proxy-Authorization": "Basic cHJveHk6c2VjcmV0",
    "Origin": "https://app.example",
}
HOP = {"Connection": "keep-alive, X-Stainless-Arch", "X-Stainless-Arch": "x64", "TE": "trailers"}

# (path, body) of each way a request reaches the upstream; None: a GET.
ROUTES: dict[str, tuple[str, dict[str, Any] | None, bool]] = {
    "chat with memory": ("/v1/chat/completions", {"stream": False}, True),
    "chat with memory, streamed": ("/v1/chat/completions", {"stream": True}, True),
    "responses with memory": ("/v1/responses", {"stream": False}, True),
    "responses with memory, streamed": ("/v1/responses", {"stream": True}, True),
    "chat without a session (passthrough)": ("/v1/chat/completions", {"stream": False}, False),
    "chat without a session, streamed": ("/v1/chat/completions", {"stream": True}, False),
    "passthrough GET": ("/v1/models", None, False),
    "passthrough POST": ("/v1/embeddings", {"input": "hello"}, False),
}


def _body(path: str, extra: dict[str, Any]) -> dict[str, Any]:
    if path == "/v1/responses":
        return {"model": "fake-model", "input": "hello", **extra}
    if path == "/v1/chat/completions":
        return {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], **extra}
    return {"model": "fake-embedding", **extra}


def _send(gateway: ServerThread, key: str, route: str, headers: dict[str, str]) -> str:
    """Send the route's request; return the id that tells its upstream request apart."""
    path, extra, memory = ROUTES[route]
    marker = f"req-{uuid.uuid4().hex}"
    sent = {"Authorization": f"Bearer {key}", "X-Client-Request-Id": marker, **headers}
    if memory:
        sent["X-Session-Id"] = f"sess-{uuid.uuid4().hex[:12]}"
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        if extra is None:
            response = http.get(path, headers=sent)
        else:
            response = http.post(path, json=_body(path, extra), headers=sent)
    assert response.status_code == 200, response.text
    return marker


def _received(fake: FakeUpstream, marker: str) -> SeenRequest:
    def mine() -> list[SeenRequest]:
        return [r for r in fake.requests if r.headers.get("x-client-request-id") == marker]

    wait_for(lambda: len(mine()) == 1)
    return mine()[0]


@pytest.mark.parametrize("route", ROUTES)
def test_forward_mode_sends_the_allowlist_and_the_clients_own_key_only(
    gateway: ServerThread, fake_upstream: FakeUpstream, route: str
) -> None:
    marker = _send(gateway, CLIENT_KEY, route, {**SDK, **ACCOUNT, **NEVER, **HOP})
    got = _received(fake_upstream, marker).headers
    for name, value in {**SDK, **ACCOUNT}.items():
        assert got.get(name.lower()) == value, name
    assert got["authorization"] == f"Bearer {CLIENT_KEY}"  # its own key, as it sent it
    for name in [*NEVER, "x-stainless-arch", "te", "x-session-id"]:
        assert name.lower() not in got, name
    assert not any(secret in str(got) for secret in NEVER.values())


@pytest.mark.parametrize("route", ROUTES)
def test_keys_mode_sends_the_operators_key_and_none_of_the_clients(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, route: str
) -> None:
    gateway = make_gateway(
        auth={"mode": "keys", "keys": [{"key": GATEWAY_KEY, "tenant": "team-h"}]},
        upstream={"api_key": OPERATOR_KEY, "passthrough": ["models", "embeddings", "responses"]},
    )
    marker = _send(gateway, GATEWAY_KEY, route, {**SDK, **ACCOUNT, **NEVER, **HOP})
    got = _received(fake_upstream, marker).headers
    for name, value in SDK.items():
        assert got.get(name.lower()) == value, name
    assert got["authorization"] == f"Bearer {OPERATOR_KEY}"
    # Not the client's account on the operator's key, nor any of its other credentials.
    for name in [*ACCOUNT, *NEVER, "x-stainless-arch", "te"]:
        assert name.lower() not in got, name
    assert GATEWAY_KEY not in str(got)


def test_the_operator_may_forward_more(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # OpenRouter's attribution headers, say: named in upstream.forward_headers.
    gateway = make_gateway(upstream={"forward_headers": ["HTTP-Referer", "x-title", "x-trace-*"]})
    extra = {"HTTP-Referer": "https://app.example", "X-Title": "App", "X-Trace-Span": "7"}
    for route in ["chat with memory, streamed", "passthrough GET"]:
        marker = _send(gateway, CLIENT_KEY, route, {**extra, **NEVER})
        got = _received(fake_upstream, marker).headers
        assert {name: got.get(name.lower()) for name in extra} == extra
        assert not set(map(str.lower, NEVER)) & set(got)
