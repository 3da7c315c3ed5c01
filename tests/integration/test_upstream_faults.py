"""Upstream errors, timeouts, broken or malformed streams and client disconnects, over
real sockets: what the client sees, what the upstream sees, and what memory keeps."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from functools import partial

import httpx
import openai
import pytest

from devsupport.disconnects import RawChat, measure_disconnects
from devsupport.fake_upstream import BIG_WORD, FakeUpstream
from devsupport.servers import RedisProcess, ServerThread, free_port
from devsupport.stored import stored_log
from gateway.service.turn_service import TurnService
from tests.support.clients import say, sdk
from tests.support.fixtures import GatewayFactory
from tests.support.resetting_upstream import ResettingUpstream
from tests.support.waiting import reached, wait_for

WHOLE_TURN = [("user", "hi there"), ("assistant", "ack: hi there")]


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


def data_events(response: httpx.Response) -> list[str]:
    return [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]


def turns(redis_server: RedisProcess, key: str, session: str) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in stored_log(redis_server, key, session)]


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_errors_pass_through_with_status_body_and_retry_after(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    stream: bool,
) -> None:
    failed = chat(gateway, api_key, session_id, "error-500", stream=stream)
    assert failed.status_code == 500
    assert failed.json()["error"]["message"] == "upstream exploded"
    limited = chat(gateway, api_key, session_id, "rate-limit", stream=stream)
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "7"
    assert limited.json()["error"]["type"] == "rate_limit_error"
    html = chat(gateway, api_key, session_id, "error-html", stream=stream)
    assert html.status_code == 503
    assert html.headers["content-type"].startswith("text/html")
    assert "503 Service Unavailable" in html.text
    assert len(fake_upstream.proxied_requests()) == 3  # one each: nothing retried
    assert stored_log(redis_server, api_key, session_id) == []  # no half turn recorded


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("model", "exception", "status"),
    [
        ("rate-limit", openai.RateLimitError, 429),
        ("error-500", openai.InternalServerError, 500),
        ("error-html", openai.InternalServerError, 503),
    ],
)
def test_sdk_sees_the_upstream_error(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    api_key: str,
    session_id: str,
    model: str,
    exception: type[openai.APIStatusError],
    status: int,
    stream: bool,
) -> None:
    client = sdk(gateway, api_key, session_id)
    with pytest.raises(exception) as raised:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "x"}], stream=stream
        )
    assert raised.value.status_code == status
    if model == "rate-limit":
        assert raised.value.response.headers["retry-after"] == "7"
    if model == "error-html":
        assert "503 Service Unavailable" in raised.value.response.text
    assert len(fake_upstream.proxied_requests()) == 1


def test_connect_failure_is_a_clear_502(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(upstream={"base_url": f"http://127.0.0.1:{free_port()}/v1"})
    response = chat(gateway, api_key, session_id, "fake-model")
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"


@pytest.mark.parametrize("stream", [False, True])
def test_connection_reset_before_headers_is_a_502_and_not_retried(
    make_gateway: GatewayFactory,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    stream: bool,
) -> None:
    with ResettingUpstream() as upstream:
        gateway = make_gateway(upstream={"base_url": upstream.url})
        response = chat(gateway, api_key, session_id, "fake-model", stream=stream)
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["type"] == "upstream_error"
        assert error["code"] == "upstream_unreachable"
        assert upstream.connections == 1
    assert stored_log(redis_server, api_key, session_id) == []


@pytest.mark.parametrize("stream", [False, True])
def test_first_byte_timeout_is_a_504(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    api_key: str,
    session_id: str,
    stream: bool,
) -> None:
    gateway = make_gateway(upstream={"timeouts": {"first_byte_s": 0.5}})
    start = time.monotonic()
    response = chat(gateway, api_key, session_id, "slow-first-byte", stream=stream)
    elapsed = time.monotonic() - start
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "upstream_timeout"
    assert elapsed < 2.5
    # The gateway hung up on the upstream: the call ends there, not 3 s later.
    assert reached(lambda: bool(fake_upstream.disconnects), timeout=1.5)
    assert len(fake_upstream.proxied_requests()) == 1


def test_an_upstream_that_does_not_stream_when_asked_is_a_502(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    response = chat(gateway, api_key, session_id, "not-sse", stream=True)
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_not_streaming"
    assert "application/json" in error["message"]
    assert stored_log(redis_server, api_key, session_id) == []
    with pytest.raises(openai.InternalServerError):
        sdk(gateway, api_key, session_id).chat.completions.create(
            model="not-sse", messages=[{"role": "user", "content": "x"}], stream=True
        )
    # Not streamed, the same upstream answer is a plain completion and is recorded.
    assert chat(gateway, api_key, session_id, "not-sse").json()["choices"][0]["message"]
    assert turns(redis_server, api_key, session_id) == WHOLE_TURN


# --- Streams that break after the first byte ----------------------------------------------


@pytest.mark.parametrize("model", ["stall-stream", "break-stream", "sse-truncated"])
def test_stream_that_breaks_ends_with_an_error_event_and_records_nothing(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    model: str,
) -> None:
    gateway = make_gateway(upstream={"timeouts": {"idle_s": 0.5}})
    response = chat(gateway, api_key, session_id, model, stream=True)
    assert response.status_code == 200
    events = data_events(response)
    assert "[DONE]" not in events
    assert json.loads(events[1])["choices"][0]["delta"]["content"] == "ack:"  # relayed first
    error = json.loads(events[-1])["error"]
    assert (
        error["code"]
        == {
            "stall-stream": "upstream_timeout",
            "break-stream": "upstream_stream_broken",
            "sse-truncated": "upstream_stream_incomplete",
        }[model]
    )
    assert error["type"] == "upstream_error"
    assert len(fake_upstream.proxied_requests()) == 1  # no retry once bytes reached the client
    assert stored_log(redis_server, api_key, session_id) == []


@pytest.mark.parametrize("model", ["stall-stream", "break-stream", "sse-truncated"])
def test_sdk_raises_on_a_broken_stream(
    make_gateway: GatewayFactory, api_key: str, session_id: str, model: str
) -> None:
    gateway = make_gateway(upstream={"timeouts": {"idle_s": 0.5}})
    stream = sdk(gateway, api_key, session_id).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi there"}], stream=True
    )
    received: list[str] = []
    with pytest.raises(openai.APIError) as raised:
        for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "ack: hi"
    assert isinstance(raised.value.body, dict) and raised.value.body["type"] == "upstream_error"


# --- Malformed streams --------------------------------------------------------------------

# What the gateway records for each malformed stream (the bytes are relayed untouched):
# only an answer it could read whole, from a stream that ended cleanly. The stream is
# acknowledged ([DONE]) only when its turn was stored: the gateway adds it after a clean
# close without one, and sends an error event in its place for a turn it did not store.
MALFORMED: dict[str, bool] = {
    "malformed-sse": False,  # a data line of broken JSON: the SDK raises on it
    "sse-noise": True,  # comments and non-field lines: ignored, per the SSE spec
    "sse-garbage-bytes": False,  # not UTF-8: the SDK raises on it
    "sse-invalid-utf8": False,  # content that is not UTF-8
    "sse-huge-line": False,  # a 3 MiB line: dropped by the decoder, not buffered
    "sse-big-chunk": True,  # a 512 KiB word in one chunk: within the limit
    "sse-no-done": True,  # a finish_reason, then a clean close without [DONE]
}


@pytest.mark.parametrize("model", list(MALFORMED))
def test_malformed_stream_is_relayed_untouched_and_recorded_only_if_readable(
    gateway: ServerThread,
    upstream_url: str,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    model: str,
) -> None:
    direct = httpx.post(
        upstream_url + "/chat/completions",
        json={
            "model": model,
            "stream": True,
            "messages": [{"role": "user", "content": "hi there"}],
        },
        timeout=20,
    )
    response = chat(gateway, api_key, session_id, model, stream=True)
    assert response.status_code == 200
    # Byte for byte what the upstream sent (its completion ids aside) up to its [DONE].
    done = b"data: [DONE]\n\n"
    relayed, sent = _without_ids(response.content), _without_ids(direct.content)
    answered = sent.split(done)[0]
    if MALFORMED[model]:
        assert relayed == answered + done  # the upstream's [DONE], or the gateway's
        assert not any('"error"' in event for event in data_events(response))
    else:
        assert relayed.startswith(answered) and done not in relayed
        last = json.loads(data_events(response)[-1])
        assert last["error"]["code"] == "memory_not_recorded"
        assert "the upstream's stream was malformed" in last["error"]["message"]
    answer = "ack: hi there" + (f" {BIG_WORD}" if model == "sse-big-chunk" else "")
    expected = [("user", "hi there"), ("assistant", answer)] if MALFORMED[model] else []
    assert turns(redis_server, api_key, session_id) == expected
    # The gateway is still serving.
    assert say(sdk(gateway, api_key, session_id + "-next"), "still there?") == "ack: still there?"


def _without_ids(body: bytes) -> bytes:
    return re.sub(rb"chatcmpl-\d+", b"chatcmpl-N", body)


# --- Clients that leave -------------------------------------------------------------------


def _raw_chat(gateway: ServerThread, key: str, session: str, model: str, stream: bool) -> RawChat:
    body = {
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": "a b c d e"}],
    }
    headers = {"Authorization": f"Bearer {key}", "X-Session-Id": session}
    return RawChat(gateway.url, body, headers)


@pytest.mark.parametrize(
    ("model", "stream"),
    [
        ("slow-first-byte", True),  # no headers yet
        ("slow-first-byte", False),  # a non-streamed request, waiting for its answer
        ("slow-first-chunk", True),  # headers, no chunk yet
        ("slow-stream", True),  # mid-stream
    ],
)
def test_client_leaving_cancels_the_upstream_within_a_second_and_records_nothing(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    model: str,
    stream: bool,
) -> None:
    client = _raw_chat(gateway, api_key, session_id, model, stream)
    if model == "slow-first-chunk":
        assert client.read_until(RawChat.has_head)
    if model == "slow-stream":
        assert client.read_until(lambda c: len(c.events()) >= 2)
    assert reached(lambda: bool(fake_upstream.in_flight), 3.0)  # the upstream is at work
    time.sleep(0.2)  # the client stays a while at this point (not a wait for anything)
    left_at = client.leave()
    assert reached(lambda: bool(fake_upstream.disconnects), 3.0), "the upstream was not cancelled"
    assert fake_upstream.disconnects[0].at - left_at < 1.0
    assert not fake_upstream.in_flight
    assert len(fake_upstream.proxied_requests()) == 1
    # Over, and no recording under way: nothing was recorded, nor will be.
    wait_for(lambda: gateway.requests_running == 0, 5, "the request over")
    assert not gateway.running(TurnService._record_now)
    assert stored_log(redis_server, api_key, session_id) == []


def _ended(fake: FakeUpstream, prompt: str) -> bool:
    return not any(call.prompt == prompt for call in list(fake.in_flight))


@dataclass
class _EndRun:
    log: list[tuple[str, str]]  # the session's log once everything settled
    whole: list[tuple[str, str]]  # what a recorded turn must be
    log_at_done: list[tuple[str, str]] | None  # read the moment [DONE] reached the client


def _leave_near_the_end(
    gateway: ServerThread,
    fake: FakeUpstream,
    redis_server: RedisProcess,
    key: str,
    run: str,
    *,
    leave_after: float | None,
    pause_writes_s: float = 0.0,
) -> _EndRun:
    """Read up to the finish_reason chunk, then leave ``leave_after`` s later (None: once
    ``[DONE]`` arrives). ``pause_writes_s``: Redis refuses writes that long from then on,
    so the recording, begun when ``[DONE]`` reaches the gateway, lasts until it ends."""
    session = f"sess-end-{run}-{time.monotonic_ns()}"
    text = f"end race {run}"
    body = {"model": "slow-done", "stream": True, "messages": [{"role": "user", "content": text}]}
    client = RawChat(gateway.url, body, {"Authorization": f"Bearer {key}", "X-Session-Id": session})
    assert client.read_until(lambda c: '"finish_reason": "stop"' in c.body.decode())
    resumed = time.monotonic() + pause_writes_s
    if pause_writes_s:
        admin = redis_server.client()
        admin.execute_command("CLIENT", "PAUSE", int(pause_writes_s * 1000), "WRITE")
        admin.close()
    log_at_done = None
    if leave_after is None:
        assert client.read_until(lambda c: "[DONE]" in c.events())
        log_at_done = turns(redis_server, key, session)
    else:
        time.sleep(leave_after)
    client.leave()
    assert reached(partial(_ended, fake, text), 3.0)
    # The Redis pause this run set runs out (the scenario's length: the next run starts
    # on a Redis that takes writes); then the request is over (a recording it began has
    # begun) and so is any recording under way.
    time.sleep(max(0.0, resumed - time.monotonic()))
    wait_for(lambda: gateway.requests_running == 0, 5, "the request over")
    wait_for(lambda: not gateway.running(TurnService._record_now), 10, "the recording over")
    whole = [("user", text), ("assistant", f"ack: {text}")]
    return _EndRun(turns(redis_server, key, session), whole, log_at_done)


def test_leaving_around_the_end_records_the_whole_turn_or_nothing(
    gateway: ServerThread, fake_upstream: FakeUpstream, redis_server: RedisProcess, api_key: str
) -> None:
    """30 clients leave after the last content chunk, at times around ``[DONE]``.

    ``slow-done`` sends ``[DONE]`` 0.3 s after the finish_reason chunk. However the client
    times its exit, memory holds the user message and the whole answer, or nothing; and a
    client that received ``[DONE]`` finds its turn already there.
    """
    outcomes = []
    leave_after = [0.0, 0.1, 0.2, 0.25, 0.28, 0.29, 0.3, 0.31, 0.32, 0.35, 0.4, 0.5]
    for run, after in enumerate([*leave_after, None, None, None]):
        result = _leave_near_the_end(
            gateway, fake_upstream, redis_server, api_key, f"free-{run}", leave_after=after
        )
        assert result.log in ([], result.whole), f"left after {after} s: {result.log}"
        if after is None:
            assert result.log_at_done == result.whole
        outcomes.append(bool(result.log))
    # The runs did straddle the race: some left before [DONE] was sent, some after.
    assert True in outcomes and False in outcomes, outcomes


def test_leaving_while_the_turn_is_being_recorded_leaves_it_whole(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
) -> None:
    """Redis writes are paused for 0.8 s from the finish_reason chunk: the recording starts
    when ``[DONE]`` reaches the gateway (0.3 s) and cannot end before 0.8 s. A client that
    leaves in between must not cut it: recording is shielded, done whole once started."""
    gateway = make_gateway(redis={"timeout_ms": 5000})
    during = [0.4, 0.45, 0.5, 0.55, 0.6, 0.62, 0.65]
    before = [0.0, 0.1, 0.2]
    for run, after in enumerate([*before, *during, None, None, None, None, None]):
        result = _leave_near_the_end(
            gateway,
            fake_upstream,
            redis_server,
            api_key,
            f"paused-{run}",
            leave_after=after,
            pause_writes_s=0.8,
        )
        assert result.log in ([], result.whole), f"left after {after} s: {result.log}"
        if after is None or after in during:
            assert result.log == result.whole, f"left after {after} s: {result.log}"
        if after is None:
            # [DONE] waited for the recording: the turn was there when it arrived.
            assert result.log_at_done == result.whole


def test_an_answer_sent_with_its_done_waits_only_for_done_not_for_the_record(
    make_gateway: GatewayFactory, redis_server: RedisProcess, api_key: str
) -> None:
    """``late-one-chunk`` sends the whole answer and ``[DONE]`` in one write, 0.3 s after
    its headers; Redis writes are paused for 1 s from the gateway's headers on, so the
    recording cannot end before then. The answer's events reach the client at once; only
    ``[DONE]`` waits for the recording, and the turn is there when ``[DONE]`` arrives."""
    gateway = make_gateway(redis={"timeout_ms": 5000})
    session = f"sess-one-chunk-{time.monotonic_ns()}"
    body = {"model": "late-one-chunk", "stream": True,
            "messages": [{"role": "user", "content": "all at once"}]}  # fmt: skip
    client = RawChat(gateway.url, body, {"Authorization": f"Bearer {api_key}",
                                         "X-Session-Id": session})  # fmt: skip
    assert client.read_until(RawChat.has_head)
    admin = redis_server.client()
    admin.execute_command("CLIENT", "PAUSE", 1000, "WRITE")
    admin.close()
    paused_at = time.monotonic()
    assert client.read_until(lambda c: '"finish_reason": "stop"' in c.body.decode(), timeout=0.8)
    answered_after = time.monotonic() - paused_at
    assert "[DONE]" not in client.events()
    assert client.read_until(lambda c: "[DONE]" in c.events())
    done_after = time.monotonic() - paused_at
    assert turns(redis_server, api_key, session) == [
        ("user", "all at once"),
        ("assistant", "ack: all at once"),
    ]
    assert answered_after < 0.8 <= done_after, (answered_after, done_after)
    client.leave()


def test_repeated_disconnects_cancel_the_upstream_fast_and_orphan_nothing(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str
) -> None:
    report = measure_disconnects(gateway.url, fake_upstream, api_key=api_key, runs=50)
    print(report.summary())
    assert report.orphans == 0, report.summary()
    assert len(report.latencies_s) >= 40, report.summary()  # measured, not skipped
    assert report.p99 < 1.0, report.summary()
