"""Upstream errors, timeouts, broken streams and client disconnects, over real sockets."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.integration.conftest import GatewayFactory, sdk
from tests.integration.test_memory_proxy import stored_log
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import RedisProcess, ServerThread, free_port

pytestmark = pytest.mark.integration


def chat(
    gateway: ServerThread, key: str, session: str, model: str, *, stream: bool = False
) -> httpx.Response:
    return httpx.post(
        gateway.url + "/v1/chat/completions",
        json={
            "model": model,
            "stream": stream,
            "messages": [{"role": "user", "content": "hi there"}],
        },
        headers={"Authorization": f"Bearer {key}", "X-Session-Id": session},
        timeout=20,
    )


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_errors_pass_through_with_status_body_and_retry_after(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str, stream: bool
) -> None:
    failed = chat(gateway, api_key, session_id, "error-500", stream=stream)
    assert failed.status_code == 500
    assert failed.json()["error"]["message"] == "upstream exploded"
    limited = chat(gateway, api_key, session_id, "rate-limit", stream=stream)
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "7"
    assert limited.json()["error"]["type"] == "rate_limit_error"
    assert stored_log(redis_server, api_key, session_id) == []  # no half turn recorded


def test_sdk_sees_rate_limit_error(gateway: ServerThread, api_key: str, session_id: str) -> None:
    with pytest.raises(openai.RateLimitError) as raised:
        sdk(gateway, api_key, session_id).chat.completions.create(
            model="rate-limit", messages=[{"role": "user", "content": "x"}]
        )
    assert raised.value.response.headers["retry-after"] == "7"


def test_connect_failure_is_a_clear_502(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(upstream={"base_url": f"http://127.0.0.1:{free_port()}/v1"})
    response = chat(gateway, api_key, session_id, "fake-model")
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"


def test_first_byte_timeout_is_a_504(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(upstream={"timeouts": {"first_byte_s": 0.5}})
    start = time.monotonic()
    response = chat(gateway, api_key, session_id, "slow-first-byte", stream=True)
    elapsed = time.monotonic() - start
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "upstream_timeout"
    assert elapsed < 2.5


@pytest.mark.parametrize("model", ["stall-stream", "break-stream"])
def test_stream_that_breaks_ends_with_an_error_event_and_records_nothing(
    make_gateway: GatewayFactory,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    model: str,
) -> None:
    gateway = make_gateway(upstream={"timeouts": {"idle_s": 0.5}})
    response = chat(gateway, api_key, session_id, model, stream=True)
    assert response.status_code == 200
    events = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
    assert "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert error["code"] == (
        "upstream_timeout" if model == "stall-stream" else "upstream_stream_broken"
    )
    assert stored_log(redis_server, api_key, session_id) == []


def test_malformed_sse_is_relayed_without_crashing(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    response = chat(gateway, api_key, session_id, "malformed-sse", stream=True)
    assert response.status_code == 200
    assert "this line is not sse" in response.text and response.text.endswith("data: [DONE]\n\n")
    assert [m["content"] for m in stored_log(redis_server, api_key, session_id)] == [
        "hi there",
        "ack: hi there",
    ]


def test_client_disconnect_mid_stream_cancels_upstream_and_records_nothing(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    body = {
        "model": "slow-stream",
        "stream": True,
        "messages": [{"role": "user", "content": "a b c d e"}],
    }
    headers = {"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id}
    with (
        httpx.Client() as client,
        client.stream(
            "POST", gateway.url + "/v1/chat/completions", json=body, headers=headers
        ) as response,
    ):
        next(response.iter_raw())
        left_at = time.monotonic()
    deadline = time.monotonic() + 3
    while not fake_upstream.disconnects and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake_upstream.disconnects, "the upstream stream was not cancelled"
    assert fake_upstream.disconnects[0][0] - left_at < 1.0
    time.sleep(0.2)
    assert stored_log(redis_server, api_key, session_id) == []
