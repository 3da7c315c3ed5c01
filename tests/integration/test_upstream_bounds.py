"""Upstream answers the gateway must not hold whole, and a full upstream pool, over real
sockets: what the client sees, what memory keeps, and what the gateway holds meanwhile.

``upstream.max_response_bytes`` is small here (1 MiB) so that each test takes a moment;
the fake upstream's answers are 100 MB (streamed or not), a gzip bomb (~52 MB decoded),
or endless.
"""

from __future__ import annotations

import json
import logging
import threading
import tracemalloc
from typing import Any

import httpx
import pytest

from devsupport.fake_upstream import FakeUpstream, gzip_bomb
from devsupport.gateways import build_settings
from devsupport.servers import RedisProcess, ServerThread
from devsupport.stored import stored_log
from gateway import offload
from gateway.service.answer_tokens import COUNTED_CHARS
from gateway.text.tokens import TokenCounter
from gateway.wiring import build_clients
from tests.support.fixtures import GatewayFactory
from tests.support.waiting import reached

LIMIT = 1024 * 1024
BOUNDED = {"upstream": {"max_response_bytes": LIMIT}}
# What the gateway may allocate, all told, while it refuses an answer of LIMIT: a few
# copies of the limit. Holding the answer whole would be 52 MB (the bomb) to 100 MB.
PEAK_BYTES = 24 * 1024 * 1024


def chat_body(model: str, *, stream: bool) -> dict[str, Any]:
    return {"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


def headers(key: str, session: str | None) -> dict[str, str]:
    sent = {"Authorization": f"Bearer {key}"}
    if session is not None:
        sent["X-Session-Id"] = session
    return sent


def data_events(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def _measured(
    url: str, model: str, stream: bool, api_key: str, session_id: str
) -> tuple[httpx.Response, int]:
    """The chat answer, and the most memory the process allocated while it came."""
    gzip_bomb(stream)  # made once, before measuring
    tracemalloc.start()
    try:
        response = httpx.post(
            url + "/v1/chat/completions",
            json=chat_body(model, stream=stream),
            headers=headers(api_key, session_id),
            timeout=30,
        )
        return response, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("model", ["huge-answer", "gzip-bomb"])
def test_an_oversized_answer_is_a_502_and_nothing_is_recorded(
    make_gateway: GatewayFactory,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    model: str,
) -> None:
    gateway = make_gateway(**BOUNDED)
    response, peak = _measured(gateway.url, model, False, api_key, session_id)
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["type"] == "upstream_error"
    assert error["code"] == "upstream_response_too_large"
    assert "max_response_bytes" in error["message"]
    assert stored_log(redis_server, api_key, session_id) == []
    assert peak < PEAK_BYTES, f"{peak / 2**20:.0f} MiB allocated for a {LIMIT}-byte limit"


@pytest.mark.parametrize("model", ["huge-answer", "gzip-bomb", "endless-stream"])
def test_an_oversized_stream_ends_with_an_error_event_and_nothing_is_recorded(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    model: str,
) -> None:
    gateway = make_gateway(**BOUNDED)
    response, peak = _measured(gateway.url, model, True, api_key, session_id)
    assert response.status_code == 200
    events = data_events(response.text)
    assert "[DONE]" not in events
    assert json.loads(events[1])["choices"][0]["delta"]["content"]  # the answer flowed first
    error = json.loads(events[-1])["error"]
    assert error["type"] == "upstream_error"
    assert error["code"] == "upstream_response_too_large"
    assert "max_response_bytes" in error["message"]
    assert len(response.content) < LIMIT + 4096  # what the upstream sent, up to the limit
    assert stored_log(redis_server, api_key, session_id) == []
    assert peak < PEAK_BYTES, f"{peak / 2**20:.0f} MiB allocated for a {LIMIT}-byte limit"
    if model != "gzip-bomb":  # (the bomb is one write, gone before the gateway stops)
        # The gateway hung up on the upstream at the limit: it stops generating.
        assert reached(lambda: any(d.model == model for d in fake_upstream.disconnects))


def test_a_passthrough_is_cut_at_the_limit_counted_on_the_wire(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str
) -> None:
    gateway = make_gateway(**BOUNDED)
    received = 0
    # No session: the chat request is passed through, relayed byte for byte.
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream(
            "POST",
            gateway.url + "/v1/chat/completions",
            json=chat_body("huge-answer", stream=False),
            headers=headers(api_key, None),
            timeout=30,
        ) as response,
    ):
        assert response.status_code == 200
        for chunk in response.iter_raw():
            received += len(chunk)
    assert LIMIT // 2 < received <= LIMIT  # then the connection was cut, not ended
    assert reached(lambda: any(d.model == "huge-answer" for d in fake_upstream.disconnects))
    # Relayed raw, a gzip bomb is the ~51 KB it is on the wire: passed whole, for the
    # client to inflate if it wants.
    with httpx.stream(
        "POST",
        gateway.url + "/v1/chat/completions",
        json=chat_body("gzip-bomb", stream=False),
        headers={**headers(api_key, None), "Accept-Encoding": "gzip"},
        timeout=30,
    ) as response:
        assert response.headers["content-encoding"] == "gzip"
        assert b"".join(response.iter_raw()) == gzip_bomb(False)


def test_a_full_upstream_pool_is_a_quick_503_with_retry_after(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(
        # One tenant may take the whole pool here (its share would refuse it first).
        upstream={
            "max_connections": 2,
            "tenant_share": 1,
            "timeouts": {"pool_s": 0.3, "connect_s": 30},
        }
    )
    url = gateway.url + "/v1/chat/completions"
    with httpx.Client(timeout=30) as holder_a, httpx.Client(timeout=30) as holder_b:
        held = []
        for client in (holder_a, holder_b):  # two streams that stall: the pool's two slots
            request = client.build_request(
                "POST", url, json=chat_body("stall-stream", stream=True),
                headers=headers(api_key, session_id),
            )  # fmt: skip
            response = client.send(request, stream=True)
            assert response.status_code == 200
            held.append(response)
        refused = httpx.post(
            url, json=chat_body("fake-model", stream=False), headers=headers(api_key, session_id)
        )
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["code"] == "upstream_pool_full"
        assert error["type"] == "upstream_error"
        for response in held:
            response.close()
    # Their clients gone, the streams' connections are given back: requests go through.
    assert reached(
        lambda: (
            httpx.post(
                url,
                json=chat_body("fake-model", stream=False),
                headers=headers(api_key, session_id),
            ).status_code
            == 200
        )
    )


class _AccessLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "gateway.access":
            self.records.append(record)

    def line(self, request_id: str) -> dict[str, Any] | None:
        for record in list(self.records):
            if getattr(record, "request_id", None) == request_id:
                return record.__dict__
        return None


class _CountSpy:
    """Wraps a TokenCounter's ``count_text``: the real count, and where it ran."""

    def __init__(self, counter: TokenCounter) -> None:
        self.real = counter.count_text
        self.calls: list[tuple[str, int]] = []  # (thread name, characters)

    def __call__(self, text: str, model: str | None = None) -> int:
        self.calls.append((threading.current_thread().name, len(text)))
        return self.real(text, model)


def test_an_abandoned_long_stream_is_counted_off_the_loop_and_in_part(
    upstream_url: str, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    settings = build_settings(
        upstream_url, redis_server.url, upstream={"max_response_bytes": 16 * LIMIT}
    )
    clients = build_clients(settings, settings.redis.url)
    spy = _CountSpy(clients.tokenizer)
    clients.tokenizer.count_text = spy  # type: ignore[method-assign]
    lines = _AccessLines()
    logging.getLogger("gateway.access").addHandler(lines)
    gateway = ServerThread(clients.create_app(settings), on_stop=clients.aclose).start()
    try:
        received = 0
        with httpx.stream(
            "POST",
            gateway.url + "/v1/chat/completions",
            json=chat_body("endless-stream", stream=True),
            headers=headers(api_key, session_id),
            timeout=30,
        ) as response:
            request_id = response.headers["x-gateway-request-id"]
            for chunk in response.iter_raw():
                received += len(chunk)
                if received > 4 * COUNTED_CHARS:
                    break  # the client leaves an answer that never ends
        assert reached(lambda: lines.line(request_id) is not None)
        line = lines.line(request_id)
        assert line is not None
    finally:
        gateway.stop()
        logging.getLogger("gateway.access").removeHandler(lines)
    assert line["tokens_out"] > COUNTED_CHARS // 8  # words of 5-6 letters: ~1 token each
    assert line["tokens_out_estimated"] is True
    big = [(thread, chars) for thread, chars in spy.calls if chars >= offload.HEAVY_CHARS]
    assert big, "the answer was not counted"
    assert all(thread != gateway.thread.name for thread, _ in big)  # never on the loop
    assert max(chars for _, chars in big) <= COUNTED_CHARS  # and only a part of it
    assert stored_log(redis_server, api_key, session_id) == []


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_longer_than_a_message_may_be_is_stored_cut(
    make_gateway: GatewayFactory,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    stream: bool,
) -> None:
    # The fake upstream's "sse-big-chunk" answer ends with a 512 KiB word.
    gateway = make_gateway(server={"max_message_bytes": 64 * 1024})
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json=chat_body("sse-big-chunk", stream=stream),
        headers=headers(api_key, session_id),
        timeout=30,
    )
    assert response.status_code == 200
    assert len(response.content) > 512 * 1024  # the client got the whole answer
    stored = stored_log(redis_server, api_key, session_id)
    assert [m["role"] for m in stored] == ["user", "assistant"]
    kept = stored[1]["content"]
    assert len(kept.encode()) <= 64 * 1024
    assert kept.startswith("ack") and kept.endswith("characters]")
