"""GET /metrics on a real gateway: counters move as requests go by, labels stay bounded,
and several processes sharing PROMETHEUS_MULTIPROC_DIR answer every scrape with their sum."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis

from devsupport.servers import RedisProcess, free_port, running_redis
from gateway.memory.model import Message
from gateway.routes.prometheus import CACHE_S
from gateway.text.tokens import TokenCounter
from tests.support.clients import register_content, say, sdk
from tests.support.clock import SteppedClock
from tests.support.fixtures import GatewayFactory
from tests.support.jobs import streams
from tests.support.metrics import Samples, moved, scrape, value
from tests.support.processes import Served

CHAT = "/v1/chat/completions"
REQUESTS = "memory_gateway_requests_total"


def requests(before: Samples, after: Samples, route: str, status: int, method: str = "POST") -> int:
    return int(moved(before, after, REQUESTS, route=route, method=method, status=str(status)))


def test_requests_upstream_redis_and_tokens_are_counted(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(memory={"budget_tokens": 400})
    client = sdk(gateway, api_key, session_id)
    before = scrape(gateway.url)

    say(client, "a first message about the lighthouse keeper")
    stream = client.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": register_content("stream this answer please")}],
        stream=True,
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    with pytest.raises(openai.InternalServerError):
        say(client, "this one meets an upstream error", model="error-500")
    models = httpx.get(gateway.url + "/v1/models", headers={"Authorization": f"Bearer {api_key}"})
    assert models.status_code == 200
    state = httpx.get(
        f"{gateway.url}/memory/sessions/{session_id}",
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=10,
    )
    assert state.status_code == 200
    after = scrape(gateway.url)

    assert requests(before, after, CHAT, 200) == 2
    assert requests(before, after, CHAT, 500) == 1
    assert requests(before, after, "/v1/{path:path}", 200, "GET") == 1
    assert requests(before, after, "/memory/sessions/{sid}", 200, "GET") == 1
    # Every request that reached the upstream: its time and the gateway's own.
    count = "memory_gateway_added_latency_seconds_count"
    assert moved(before, after, count, route=CHAT) == 3
    assert moved(before, after, count, route="/v1/{path:path}") == 1
    upstream = "memory_gateway_upstream_seconds_count"
    assert moved(before, after, upstream, route=CHAT, phase="headers") == 3
    assert moved(before, after, upstream, route=CHAT, phase="total") == 3
    added = moved(before, after, "memory_gateway_added_latency_seconds_sum", route=CHAT)
    assert (
        0
        < added
        < moved(before, after, "memory_gateway_upstream_seconds_sum", route=CHAT, phase="total") + 1
    )
    # A load per chat request and a record per answered turn (the 500 records nothing),
    # each named after its store method: an identifier, never data.
    redis_calls = {
        dict(labels)["op"]: count - value(before, name, **dict(labels))
        for (name, labels), count in after.items()
        if name == "memory_gateway_redis_seconds_count"
    }
    assert sum(redis_calls.values()) >= 3 + 2, redis_calls
    assert all(re.fullmatch(r"_?[a-z_]+", op) for op in redis_calls), redis_calls
    assert moved(before, after, "memory_gateway_client_tokens_total") > 0
    assert moved(before, after, "memory_gateway_forwarded_tokens_total") > 0
    # Bounded labels: no session id, key or content anywhere in the exposition.
    text = httpx.get(gateway.url + "/metrics", timeout=10).text
    for secret in (session_id, api_key, "lighthouse"):
        assert secret not in text


def test_a_resent_long_history_shows_the_saving(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(memory={"budget_tokens": 400, "window_messages": 4})
    filler = "the archive of the northern observatory records a careful measurement {i}. " * 6
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": filler.format(i=i)}
        for i in range(20)
    ]
    messages = [*history, {"role": "user", "content": "and what came next?"}]
    before = scrape(gateway.url)
    answer = sdk(gateway, api_key, session_id).chat.completions.create(
        model="fake-model",
        messages=messages,  # type: ignore[arg-type]
    )
    assert answer.choices[0].message.content
    after = scrape(gateway.url)
    sent = moved(before, after, "memory_gateway_client_tokens_total")
    forwarded = moved(before, after, "memory_gateway_forwarded_tokens_total")
    counted = TokenCounter().count_prompt([Message.from_openai(m) for m in messages], "fake-model")
    assert abs(sent - counted) <= counted * 0.02, (sent, counted)
    assert 0 < forwarded <= 400 < sent


def test_a_degraded_request_is_counted_by_reason(
    make_gateway: GatewayFactory, api_key: str
) -> None:
    gateway = make_gateway(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    before = scrape(gateway.url)
    response = httpx.post(
        gateway.url + CHAT,
        headers={"Authorization": f"Bearer {api_key}", "X-Session-Id": "degraded-one"},
        json={"model": "fake-model", "messages": [{"role": "user", "content": "hello there"}]},
        timeout=10,
    )
    assert response.headers["x-memory-status"] == "degraded"
    after = scrape(gateway.url)
    reason = "memory_gateway_degraded_requests_total"
    assert moved(before, after, reason, reason="redis_unavailable") == 1
    assert requests(before, after, CHAT, 200) == 1
    # The backlog could not be read: said so, not a failed scrape.
    assert value(after, "memory_gateway_jobs_backlog_up") == 0


def undelivered(samples: Samples, shard: int) -> float:
    return value(samples, "memory_gateway_jobs_pending", state="undelivered", shard=str(shard))


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_the_job_backlog_is_read_from_the_stream(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    clock = SteppedClock()
    with running_redis() as server:
        gateway = make_gateway(redis_url=server.url, worker={"in_process": False}, clock=clock)
        client = sdk(gateway, api_key, session_id)
        before = scrape(gateway.url)
        assert value(before, "memory_gateway_jobs_backlog_up") == 1
        for i in range(12):  # past the hybrid preset's first chunk: jobs are enqueued
            say(client, f"message number {i} for the backlog")
        counted = redis.Redis.from_url(server.url)
        shards = {stream: counted.xlen(stream) for stream in streams()}
        assert sum(shards.values()) > 0
        clock.advance(CACHE_S)  # (the clock also moves on its own: the turns took a while)
        read_from, after, read_by = server_ms(counted), scrape(gateway.url), server_ms(counted)
        for shard, stream in enumerate(streams()):
            assert undelivered(after, shard) == shards[stream]
            assert value(after, "memory_gateway_jobs_pending", state="delivered",
                         shard=str(shard)) == 0  # fmt: skip
            lag = value(after, "memory_gateway_jobs_lag_seconds", shard=str(shard))
            if shards[stream]:  # the age of the oldest notice, by Redis's clock at the read
                ((oldest, _),) = counted.xrange(stream, count=1)
                enqueued = int(oldest.split(b"-")[0])
                assert (read_from - enqueued) / 1000 <= lag <= (read_by - enqueued) / 1000
            else:
                assert lag == 0
        # Read at most every CACHE_S: a notice added now is not seen by a scrape a moment
        # later (far within it, however slow the turns were), and is once it has passed.
        stream = streams()[0]
        counted.xadd(stream, {"added": "by the test"})
        assert undelivered(scrape(gateway.url), 0) == shards[stream]
        clock.advance(CACHE_S)
        assert undelivered(scrape(gateway.url), 0) == shards[stream] + 1
        counted.close()
        gateway.stop()


def test_metrics_can_require_a_token_or_be_off(make_gateway: GatewayFactory) -> None:
    guarded = make_gateway(server={"metrics_token": "scrape-token-123"})
    refused = httpx.get(guarded.url + "/metrics", timeout=10)
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
    assert (
        value(
            scrape(guarded.url, authorization="Bearer scrape-token-123"),
            "memory_gateway_jobs_backlog_up",
        )
        == 1
    )
    off = make_gateway(server={"metrics": False})
    assert httpx.get(off.url + "/metrics", timeout=10).status_code == 404


# --- several processes ---


def _config(tmp_path: Path, upstream_url: str, redis_url: str) -> Path:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"upstream:\n  base_url: {upstream_url}\n"
        f"redis:\n  url: {redis_url}\n"
        "memory:\n  preset: hybrid\n"
        "summarizer:\n  model: fake-summarizer\n"
    )
    return config


@pytest.fixture
def config(tmp_path: Path, upstream_url: str, redis_server: RedisProcess) -> Path:
    return _config(tmp_path, upstream_url, redis_server.url)


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for server in started:
        if server.process.poll() is None:
            server.stop()


def chats(url: str, key: str, n: int) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    with client:
        for i in range(n):
            client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": f"question {i}"}],
                extra_headers={"X-Session-Id": f"multi-{i}"},
            )


def test_two_gateways_sharing_a_metrics_dir_report_their_sum(
    config: Path, tmp_path: Path, served: list[Served], api_key: str
) -> None:
    shared = tmp_path / "metrics"
    shared.mkdir()
    first = Served(config, shared)
    served.append(first)
    second = Served(config, shared)
    served.append(second)
    chats(first.url, api_key, 3)
    chats(second.url, api_key, 2)
    for server in (first, second):
        total = value(
            scrape(server.url),
            "memory_gateway_requests_total",
            route=CHAT,
            method="POST",
            status="200",
        )
        assert total == 5
    # A process that stopped keeps its counts in the sum (counters never go back).
    first.stop()
    total = value(
        scrape(second.url), "memory_gateway_requests_total", route=CHAT, method="POST", status="200"
    )
    assert total == 5
    assert value(scrape(second.url), "memory_gateway_requests_in_flight") == 1  # the scrape itself


def test_serve_workers_share_one_set_of_metrics(
    config: Path, tmp_path: Path, served: list[Served], api_key: str
) -> None:
    shared = tmp_path / "metrics"
    shared.mkdir()
    stale = shared / "counter_1.db"  # an earlier run's: its counts must not be summed in
    stale.write_bytes(b"\0" * 8)
    server = Served(config, shared, "--workers", "2")
    served.append(server)
    chats(server.url, api_key, 6)
    assert not stale.exists()
    pids = {path.stem.rsplit("_", 1)[-1] for path in shared.glob("*.db")}
    assert len(pids) == 2, pids
    # Whichever worker answers a scrape, it reports both workers' requests.
    for _ in range(4):
        samples = scrape(server.url)
        assert value(samples, REQUESTS, route=CHAT, method="POST", status="200") == 6
