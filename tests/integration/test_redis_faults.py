"""Memory when Redis is down: fail-open answers degraded and fast, fail-closed refuses fast."""

from __future__ import annotations

import socket
import time

import pytest

from tests.integration.conftest import GatewayFactory, say, sdk
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import free_port, running_redis

pytestmark = pytest.mark.integration


def test_fail_open_serves_degraded_then_memory_resumes_after_restart(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    with running_redis(appendonly=True) as redis_server:
        gateway = make_gateway(redis_url=redis_server.url)
        client = sdk(gateway, api_key, session_id)
        say(client, "my tea is oolong")

        redis_server.stop()
        start = time.monotonic()
        raw = client.chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": "what is my tea?"}]
        )
        elapsed = time.monotonic() - start
        assert raw.headers["x-memory-status"] == "degraded"
        assert raw.parse().choices[0].message.content == "I don't know your tea."
        assert fake_upstream.last_messages() == [{"role": "user", "content": "what is my tea?"}]
        assert elapsed < 1.0, f"degraded answer took {elapsed:.3f} s"

        redis_server.start()  # same port, same AOF directory
        again = client.chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": "what is my tea?"}]
        )
        assert again.headers["x-memory-status"] == "ok"
        assert again.parse().choices[0].message.content == "Your tea is oolong."


def test_fail_closed_returns_503_fast(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(
        redis_url=f"redis://127.0.0.1:{free_port()}/0", redis={"on_failure": "closed"}
    )
    import httpx

    start = time.monotonic()
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": "x"}]},
        headers={"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id},
    )
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "memory_unavailable"
    assert time.monotonic() - start < 1.0


def test_black_holed_redis_is_bounded_by_the_deadline(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    # A listening socket nobody accepts from: the kernel completes the handshake, then
    # silence — redis-py's defaults would wait for seconds.
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        port = hole.getsockname()[1]
        gateway = make_gateway(redis_url=f"redis://127.0.0.1:{port}/0", redis={"timeout_ms": 100})
        client = sdk(gateway, api_key, session_id)
        timings = []
        for _ in range(5):
            start = time.monotonic()
            raw = client.chat.completions.with_raw_response.create(
                model="fake-model", messages=[{"role": "user", "content": "hello"}]
            )
            timings.append(time.monotonic() - start)
            assert raw.headers["x-memory-status"] == "degraded"
        # 100 ms deadline plus the upstream round trip; the margin is for a loaded 2-core
        # CI machine (redis-py's own defaults would wait for seconds)
        assert max(timings) < 1.0, timings
