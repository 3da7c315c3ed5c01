"""After a Redis restart, pooled connections reconnect before use: no turn is lost to them."""

from __future__ import annotations

import threading

import httpx

from devsupport.servers import running_redis
from tests.support.fixtures import GatewayFactory


def test_the_first_turns_after_a_redis_restart_are_remembered(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    with running_redis(appendonly=True) as redis_server, httpx.Client(timeout=30) as http:
        gateway = make_gateway(redis_url=redis_server.url)
        headers = {"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id}

        def send(text: str) -> str:
            body = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
            response = http.post(gateway.url + "/v1/chat/completions", json=body, headers=headers)
            assert response.status_code == 200
            return response.headers["x-memory-status"]

        # Fill the pool with several connections: a burst holds them all at once.
        statuses: list[str] = []
        threads = [
            threading.Thread(target=lambda i=i: statuses.append(send(f"warm {i}")))
            for i in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert statuses == ["ok"] * 8

        redis_server.stop()  # every pooled connection is now closed by the server
        redis_server.start()  # same port, same AOF

        # Each would fail once if the pool handed out closed connections unchecked.
        assert [send(f"after {i}") for i in range(8)] == ["ok"] * 8
