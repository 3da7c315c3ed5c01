"""``POST /v1/messages`` with memory, end to end: the real ``anthropic`` SDK → gateway →
the fake upstream's Messages API (``devsupport/fake_anthropic``), real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess, ServerThread, running_redis
from devsupport.stored import roles_and_text, stored_log
from tests.support.clients import sdk
from tests.support.fixtures import GatewayFactory
from tests.support.images import PNG_1PX

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


_OPEN: list[anthropic.Anthropic] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def claude(
    gateway: ServerThread, key: str, session: str | None, headers: dict[str, str] | None = None
) -> anthropic.Anthropic:
    """The SDK as an app configures it: the gateway's URL and one header (closed after
    the test)."""
    sent = {**({"X-Session-Id": session} if session is not None else {}), **(headers or {})}
    client = anthropic.Anthropic(
        base_url=gateway.url, api_key=key, default_headers=sent, max_retries=0
    )
    _OPEN.append(client)
    return client


def said(message: anthropic.types.Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def forwarded(fake: FakeUpstream, n: int = -1) -> dict[str, Any]:
    requests = fake.messages_requests()
    assert requests, "nothing reached the upstream's /v1/messages"
    return dict(requests[n].json())


def system_texts(body: dict[str, Any]) -> list[str]:
    system = body.get("system") or []
    return [system] if isinstance(system, str) else [block["text"] for block in system]


def texts(body: dict[str, Any]) -> list[str]:
    found = system_texts(body)
    for message in body["messages"]:
        content = message["content"]
        found += [content] if isinstance(content, str) else [b.get("text", "") for b in content]
    return found


def test_a_fact_is_remembered_across_turns_and_the_log_is_exact(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = claude(gateway, api_key, session_id)
    raw = client.messages.with_raw_response.create(
        model="claude-fake",
        max_tokens=100,
        system="You are terse.",
        messages=[{"role": "user", "content": "my seat is 14C"}],
    )
    assert raw.headers["x-memory-status"] == "ok"
    first = raw.parse()
    assert said(first) == "ack: my seat is 14C"
    # The client sends only its new message: memory is the conversation.
    answer = client.messages.create(
        model="claude-fake",
        max_tokens=100,
        system="You are terse.",
        messages=[{"role": "user", "content": "What is my seat?"}],
    )
    assert said(answer) == "Your seat is 14C."
    body = forwarded(fake_upstream)
    assert "my seat is 14C" in texts(body)
    assert system_texts(body)[0] == "You are terse."  # the client's prompt, first
    headers = fake_upstream.messages_requests()[-1].headers
    # Forward mode: the client's own key, in the header it came in (the SDK's Bearer).
    assert headers["authorization"] == f"Bearer {api_key}"
    assert "x-api-key" not in headers and "x-session-id" not in headers
    assert headers["anthropic-version"]
    assert roles_and_text(stored_log(redis_server, api_key, session_id)) == [
        ("user", "my seat is 14C"),
        ("assistant", "ack: my seat is 14C"),
        ("user", "What is my seat?"),
        ("assistant", "Your seat is 14C."),
    ]


def test_a_streamed_answer_is_relayed_and_remembered(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = claude(gateway, api_key, session_id)
    history = [{"role": "user", "content": "my dog is Rex"}]
    with client.messages.stream(model="claude-fake", max_tokens=100, messages=history) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "ack: my dog is Rex" and final.stop_reason == "end_turn"
    # A client that resends its whole history: lined up with memory, nothing doubled.
    history += [
        {"role": "assistant", "content": text},
        {"role": "user", "content": "What is my dog?"},
    ]
    with client.messages.stream(model="claude-fake", max_tokens=100, messages=history) as stream:
        assert "".join(stream.text_stream) == "Your dog is Rex."
    assert roles_and_text(stored_log(redis_server, api_key, session_id)) == [
        ("user", "my dog is Rex"),
        ("assistant", "ack: my dog is Rex"),
        ("user", "What is my dog?"),
        ("assistant", "Your dog is Rex."),
    ]


def test_streamed_events_are_relayed_as_they_arrive(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    client = claude(gateway, api_key, session_id)
    history = [{"role": "user", "content": "a slow one"}]
    done = fake_upstream.anthropic.completed_streams
    with client.messages.stream(model="slow-stream", max_tokens=100, messages=history) as stream:
        first = next(iter(stream.text_stream))
        # The first words reached the client while the upstream was still writing.
        assert first and fake_upstream.anthropic.completed_streams == done
        rest = "".join(stream.text_stream)
    assert first + rest == "ack: a slow one"
    assert fake_upstream.anthropic.completed_streams == done + 1


def test_an_image_is_remembered_and_sent_again_as_anthropics_image_block(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = claude(gateway, api_key, session_id)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": PNG_1PX}}  # fmt: skip
    shown = [image, {"type": "text", "text": "my cat is Tom"}]
    client.messages.create(
        model="claude-fake", max_tokens=50, messages=[{"role": "user", "content": shown}]
    )
    answer = client.messages.create(
        model="claude-fake",
        max_tokens=50,
        messages=[{"role": "user", "content": "What is my cat?"}],
    )
    assert said(answer) == "Your cat is Tom."
    # From memory, the image goes again as the block the client sent (the fake upstream
    # refuses any other shape), before its text.
    remembered = forwarded(fake_upstream)["messages"][0]["content"]
    assert remembered[0] == image and remembered[-1]["text"].endswith("my cat is Tom")
    # Stored as a reference to the image's bytes, not the bytes in the log.
    (first, *_) = stored_log(redis_server, api_key, session_id)
    assert PNG_1PX not in str(first) and "my cat is Tom" in str(first)


def test_an_upstream_error_mid_stream_is_relayed_and_nothing_is_stored(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = claude(gateway, api_key, session_id)
    said_first = [{"role": "user", "content": "my dog is Rex"}]
    client.messages.create(model="claude-fake", max_tokens=100, messages=said_first)
    cut = [{"role": "user", "content": "my cat is Tom"}]
    with (
        pytest.raises(anthropic.APIStatusError) as failed,
        client.messages.stream(model="fail-stream", max_tokens=100, messages=cut) as stream,
    ):
        for _ in stream.text_stream:
            pass
    # The upstream's own error event, as it sent it; no message_stop after it.
    assert failed.value.body["error"]["type"] == "overloaded_error"
    # A turn cut short is not memory: only the whole one before it is stored.
    assert roles_and_text(stored_log(redis_server, api_key, session_id)) == [
        ("user", "my dog is Rex"),
        ("assistant", "ack: my dog is Rex"),
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_and_its_result_stay_together(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    stream: bool,
) -> None:
    client = claude(gateway, api_key, session_id)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "weather in Paris?"}]

    def ask() -> anthropic.types.Message:
        options = {
            "model": "tool-caller",
            "max_tokens": 100,
            "tools": [WEATHER],
            "messages": messages,
        }
        if not stream:
            return client.messages.create(**options)
        with client.messages.stream(**options) as events:
            return events.get_final_message()

    call = ask()
    assert call.stop_reason == "tool_use"
    (use,) = [block for block in call.content if block.type == "tool_use"]
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in call.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18C"}],
        },
    ]
    final = ask()
    assert "18C" in said(final)
    log = stored_log(redis_server, api_key, session_id)
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "assistant"]
    assert log[1]["tool_calls"][0]["id"] == use.id
    assert log[2]["tool_call_id"] == use.id


def test_one_session_mixes_the_three_apis(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    claude(gateway, api_key, session_id).messages.create(
        model="claude-fake",
        max_tokens=50,
        messages=[{"role": "user", "content": "my city is Lyon"}],
    )
    openai_client = sdk(gateway, api_key, session_id)
    chat = openai_client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "What is my city?"}]
    )
    assert chat.choices[0].message.content == "Your city is Lyon."
    openai_client.responses.create(model="fake-model", input="my color is teal")
    answer = claude(gateway, api_key, session_id).messages.create(
        model="claude-fake",
        max_tokens=50,
        messages=[{"role": "user", "content": "What is my color?"}],
    )
    assert said(answer) == "Your color is teal."
    # One log, each turn once, whichever API said it.
    assert roles_and_text(stored_log(redis_server, api_key, session_id)) == [
        ("user", "my city is Lyon"),
        ("assistant", "ack: my city is Lyon"),
        ("user", "What is my city?"),
        ("assistant", "Your city is Lyon."),
        ("user", "my color is teal"),
        ("assistant", "ack: my color is teal"),
        ("user", "What is my color?"),
        ("assistant", "Your color is teal."),
    ]


def test_errors_come_in_anthropics_envelope(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    client = claude(gateway, api_key, session_id)
    # The gateway's own refusal (no max_tokens: the SDK would refuse it first).
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.post("/v1/messages", body={"model": "m", "messages": []}, cast_to=object)
    assert bad.value.body["type"] == "error"
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in bad.value.body["error"]["message"]
    # The upstream's, relayed as it came.
    with pytest.raises(anthropic.InternalServerError) as failed:
        client.messages.create(
            model="overloaded", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert failed.value.status_code == 529
    assert failed.value.body["error"]["type"] == "overloaded_error"


def test_without_a_session_the_request_goes_as_sent(
    gateway: ServerThread, fake_upstream: FakeUpstream, redis_server: RedisProcess, api_key: str
) -> None:
    client = claude(gateway, api_key, None)
    raw = client.messages.with_raw_response.create(
        model="claude-fake", max_tokens=10, messages=[{"role": "user", "content": "my cat is Tom"}]
    )
    assert raw.headers["x-memory-status"] == "off"
    assert said(raw.parse()) == "ack: my cat is Tom"
    assert fake_upstream.messages_requests()[-1].headers["authorization"] == f"Bearer {api_key}"
    count = client.messages.count_tokens(
        model="claude-fake", messages=[{"role": "user", "content": "hi"}]
    )
    assert count.input_tokens > 0


def test_an_x_api_key_goes_upstream_as_x_api_key(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    # Claude Code's ANTHROPIC_API_KEY: taken as the caller's key, sent on as it came.
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "my x is 1"}]}
    with httpx.Client(base_url=gateway.url) as http:
        sent = http.post(
            "/v1/messages",
            json=body,
            headers={
                "x-api-key": api_key,
                "anthropic-version": "2023-06-01",
                "x-session-id": session_id,
                "openai-organization": "org-of-another-api",
            },
        )
    assert sent.status_code == 200, sent.text
    assert sent.headers["x-memory-status"] == "ok"
    headers = fake_upstream.messages_requests()[-1].headers
    assert headers["x-api-key"] == api_key
    assert headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in headers and "openai-organization" not in headers


def test_two_keys_are_refused_and_a_bad_one_in_anthropics_envelope(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    both = {"x-api-key": api_key, "authorization": "Bearer other-key-0123"}
    with httpx.Client(base_url=gateway.url) as http:
        twice = http.post("/v1/messages", json=body, headers={**both, "x-session-id": session_id})
        short = http.post("/v1/messages", json=body, headers={"x-api-key": "abc"})
    # The gateway would check one key while the upstream might use the other.
    assert twice.status_code == 400
    assert twice.json()["error"]["type"] == "invalid_request_error"
    assert short.status_code == 401
    with httpx.Client(base_url=gateway.url) as http:
        none = http.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert none.status_code == 401
    assert "'x-api-key: <key>'" in none.json()["error"]["message"]  # Anthropic's header named
    assert short.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": short.json()["error"]["message"]},
    }


@pytest.mark.parametrize("anthropic_key", ["sk-ant-operator-0123", None])
def test_with_gateway_keys_the_upstream_gets_the_operators_anthropic_key_only(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    session_id: str,
    anthropic_key: str | None,
) -> None:
    # The issued key never leaves the gateway, nor does the OpenAI upstream's key go to
    # the Anthropic one: with no upstream.anthropic_api_key, no key at all.
    key = "gw-key-claude-0123456789"
    gateway = make_gateway(
        auth={"mode": "keys", "keys": [{"key": key, "tenant": "team-c"}]},
        upstream={"api_key": "sk-openai-operator-0123", "anthropic_api_key": anthropic_key},
    )
    client = claude(gateway, key, session_id)
    message = {"role": "user", "content": "my seat is 14C"}
    if anthropic_key is None:
        with pytest.raises(anthropic.AuthenticationError):  # the upstream's 401, relayed
            client.messages.create(model="claude-fake", max_tokens=20, messages=[message])
    else:
        client.messages.create(model="claude-fake", max_tokens=20, messages=[message])
    headers = fake_upstream.messages_requests()[-1].headers
    assert headers.get("x-api-key") == anthropic_key
    assert "authorization" not in headers
    assert all(key not in value and "sk-openai" not in value for value in headers.values())


def test_redis_down_serves_degraded_then_memory_resumes(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    def ask(client: anthropic.Anthropic, text: str) -> Any:
        return client.messages.with_raw_response.create(
            model="claude-fake", max_tokens=50, messages=[{"role": "user", "content": text}]
        )

    with running_redis(appendonly=True) as redis_server:
        client = claude(make_gateway(redis_url=redis_server.url), api_key, session_id)
        ask(client, "my tea is oolong")
        redis_server.stop()
        raw = ask(client, "What is my tea?")
        # Fail-open: forwarded as the client sent it, answered, nothing remembered.
        assert raw.headers["x-memory-status"] == "degraded"
        assert said(raw.parse()) == "I don't know your tea."
        body = forwarded(fake_upstream)
        assert body["messages"] == [{"role": "user", "content": "What is my tea?"}]
        redis_server.start()  # same port, same AOF directory
        again = ask(client, "What is my tea?")
        assert again.headers["x-memory-status"] == "ok"
        assert said(again.parse()) == "Your tea is oolong."


def test_read_mode_injects_memory_and_records_nothing(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    claude(gateway, api_key, session_id).messages.create(
        model="claude-fake", max_tokens=50, messages=[{"role": "user", "content": "my car is blue"}]
    )
    reader = claude(gateway, api_key, session_id, {"X-Memory-Mode": "read"})
    raw = reader.messages.with_raw_response.create(
        model="claude-fake",
        max_tokens=50,
        messages=[{"role": "user", "content": "What is my car?"}],
    )
    assert raw.headers["x-memory-status"] == "ok"
    assert raw.headers["x-memory-receipt"]  # what memory put in, as for chat
    assert said(raw.parse()) == "Your car is blue."
    assert len(stored_log(redis_server, api_key, session_id)) == 2


def test_limits_refuse_in_anthropics_envelope_before_the_upstream(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    """A tenant's request limit and the body limit hold for /v1/messages as for chat, and
    the SDK reads their refusals as Anthropic's own (its RateLimitError, its 413)."""
    gateway = make_gateway(
        limits={"tenant": {"requests_per_minute": 2}}, server={"max_body_bytes": 64 * 1024}
    )
    client = claude(gateway, api_key, session_id)
    message = {"role": "user", "content": "my seat is 14C"}
    for _ in range(2):
        client.messages.create(model="claude-fake", max_tokens=20, messages=[message])
    with pytest.raises(anthropic.RateLimitError) as limited:
        client.messages.create(model="claude-fake", max_tokens=20, messages=[message])
    assert limited.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": limited.value.body["error"]["message"]},
    }
    assert 1 <= int(limited.value.response.headers["retry-after"]) <= 120
    assert len(fake_upstream.messages_requests()) == 2  # the refused one never went on

    roomy = claude(make_gateway(server={"max_body_bytes": 64 * 1024}), api_key, session_id)
    huge = {"role": "user", "content": "x" * (128 * 1024)}
    with pytest.raises(anthropic.APIStatusError) as too_large:
        roomy.messages.create(model="claude-fake", max_tokens=20, messages=[huge])
    assert too_large.value.status_code == 413
    assert too_large.value.body["error"]["type"] == "request_too_large"
    assert len(fake_upstream.messages_requests()) == 2
