"""``POST /v1/responses`` with memory, end to end: the real OpenAI SDK → gateway → the
fake upstream's Responses API, real Redis."""

from __future__ import annotations

import json
import re
import signal
import threading
from collections import Counter
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from devsupport.fake_responses import as_messages
from devsupport.fake_upstream import SMALL_CONTEXT_TOKENS, FakeUpstream, prompt_tokens
from devsupport.servers import RedisProcess, ServerThread, running_redis
from devsupport.stored import roles_and_text, stored_log
from gateway.config import STATELESS_PATHS
from tests.support.clients import LONG, Memory, say, sdk
from tests.support.fixtures import GatewayFactory
from tests.support.images import PNG_1PX

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def last_forwarded(fake: FakeUpstream) -> dict[str, Any]:
    requests = fake.responses_requests()
    assert requests, "nothing reached the upstream's /v1/responses"
    return dict(requests[-1].json())


def forwarded_texts(body: dict[str, Any]) -> list[str]:
    texts = []
    for item in body["input"]:
        if item.get("type") == "message":
            texts += [part["text"] for part in item["content"] if "text" in part]
    return texts


def test_a_fact_is_remembered_across_turns(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = sdk(gateway, api_key, session_id)
    raw = client.responses.with_raw_response.create(model="fake-model", input="my city is Lyon")
    assert raw.headers["x-memory-status"] == "ok"
    assert int(raw.headers["x-memory-context-tokens"]) > 0
    assert raw.headers["x-memory-receipt"]
    assert raw.parse().output_text == "ack: my city is Lyon"

    answer = client.responses.create(model="fake-model", input="What is my city?")
    assert answer.output_text == "Your city is Lyon."
    forwarded = fake_upstream.responses_requests()[-1]
    assert "my city is Lyon" in forwarded_texts(forwarded.json())
    assert "x-session-id" not in forwarded.headers
    assert roles_and_text(stored_log(redis_server, api_key, session_id)) == [
        ("user", "my city is Lyon"),
        ("assistant", "ack: my city is Lyon"),
        ("user", "What is my city?"),
        ("assistant", "Your city is Lyon."),
    ]


def test_a_streamed_answer_is_relayed_and_remembered(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = sdk(gateway, api_key, session_id)
    events = list(client.responses.create(model="fake-model", input="my dog is Rex", stream=True))
    assert events[-1].type == "response.completed"
    stream = client.responses.create(model="fake-model", input="What is my dog?", stream=True)
    events = list(stream)
    types = [event.type for event in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Your dog is Rex."
    assert [e.sequence_number for e in events] == list(range(len(events)))
    log = stored_log(redis_server, api_key, session_id)
    assert roles_and_text(log)[-2:] == [
        ("user", "What is my dog?"),
        ("assistant", "Your dog is Rex."),
    ]


def test_one_session_is_one_conversation_across_both_apis(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    say(client, "my color is teal")
    answer = client.responses.create(model="fake-model", input="What is my color?")
    assert answer.output_text == "Your color is teal."

    client.responses.create(
        model="fake-model",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "my pet is Tom"}]}],
    )
    assert say(client, "What is my pet?") == "Your pet is Tom."
    forwarded = fake_upstream.last_messages()
    # The Responses message's text parts reach chat as one string, the form every chat
    # server takes (llama-cpp-python answers a list with a 500).
    assert [m["content"] for m in forwarded if m["role"] == "user"][:3] == [
        "my color is teal",
        "What is my color?",
        "my pet is Tom",
    ]


def test_instructions_are_forwarded_not_stored_and_upstream_history_is_dropped(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = sdk(gateway, api_key, session_id)
    client.responses.create(
        model="fake-model",
        input="my town is Nice",
        instructions="Answer briefly.",
        previous_response_id="resp_upstream_1",
        store=False,
        temperature=0.2,
    )
    body = last_forwarded(fake_upstream)
    assert body["instructions"] == "Answer briefly."
    assert "previous_response_id" not in body
    assert body["store"] is False and body["temperature"] == 0.2
    assert roles_and_text(stored_log(redis_server, api_key, session_id)) == [
        ("user", "my town is Nice"),
        ("assistant", "ack: my town is Nice"),
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_a_function_call_and_its_output_are_stored_together(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    stream: bool,
) -> None:
    client = sdk(gateway, api_key, session_id)
    first: Any = client.responses.create(
        model="tool-caller", input="Weather in Paris?", tools=[WEATHER_TOOL], stream=stream
    )
    if stream:
        first = next(e for e in first if e.type == "response.completed").response
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.call_id, c.name) for c in calls] == [("call_1", "get_weather")]

    # A stateless agent sends only the call's output: memory holds the call.
    second: Any = client.responses.create(
        model="tool-caller",
        input=[{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
        tools=[WEATHER_TOOL],
        stream=stream,
    )
    if stream:
        second = next(e for e in second if e.type == "response.completed").response
    assert second.output_text == "The tool said: sunny"
    items = last_forwarded(fake_upstream)["input"]
    kinds = [item.get("type") for item in items]
    at = kinds.index("function_call")
    assert items[at]["call_id"] == items[at + 1]["call_id"] == "call_1"
    assert items[at + 1] == {**items[at + 1], "type": "function_call_output", "output": "sunny"}

    log = stored_log(redis_server, api_key, session_id)
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "assistant"]
    assert log[1]["tool_calls"][0]["id"] == "call_1"
    assert log[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert log[2]["tool_call_id"] == "call_1" and log[2]["content"] == "sunny"
    assert log[3]["content"] == "The tool said: sunny"


def test_unknown_items_are_forwarded_beside_their_message_but_not_stored(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = sdk(gateway, api_key, session_id)
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    client.responses.create(
        model="fake-model",
        input=[reasoning, {"role": "user", "content": "my hat is red"}],  # type: ignore[list-item]
    )
    items = last_forwarded(fake_upstream)["input"]
    at = items.index(reasoning)
    assert items[at + 1]["role"] == "user"
    log = stored_log(redis_server, api_key, session_id)
    assert [m["role"] for m in log] == ["user", "assistant"]


def test_headers_say_not_recorded_for_an_upstream_error(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    for stream in (False, True):
        with pytest.raises(openai.InternalServerError) as raised:
            client.responses.create(model="error-500", input="hello", stream=stream)
        assert raised.value.response.headers["x-memory-status"] == "not_recorded"
    assert stored_log(redis_server, api_key, session_id) == []


def test_a_failed_stream_is_not_recorded(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    events = list(client.responses.create(model="fail-stream", input="hello", stream=True))
    assert events[-1].type == "response.failed"
    assert stored_log(redis_server, api_key, session_id) == []


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_cut_short_is_recorded_as_the_client_read_it(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str, stream: bool
) -> None:
    # max_output_tokens reached: the client read the partial answer, as with chat's
    # finish_reason "length", so memory keeps it (a history resent with it lines up).
    client = sdk(gateway, api_key, session_id)
    raw = client.responses.with_raw_response.create(model="cut-short", input="hello", stream=stream)
    if stream:
        events = list(raw.parse())
        assert events[-1].type == "response.incomplete"
    else:
        assert raw.parse().status == "incomplete"
    assert raw.headers["x-memory-status"] == "ok"
    assert roles_and_text(stored_log(redis_server, api_key, session_id)) == [
        ("user", "hello"), ("assistant", "ack: hello"),
    ]  # fmt: skip


def test_a_malformed_stream_is_not_acknowledged_since_it_is_not_stored(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    # One event whose data is not JSON, then the answer and response.completed: the
    # gateway cannot vouch for what it read, stores nothing, and says so in place of
    # response.completed (before, the client got response.completed and "ok").
    response = httpx.post(
        gateway.url + "/v1/responses",
        json={"model": "malformed-sse", "input": "hello", "stream": True},
        headers={"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id},
        timeout=30,
    )
    assert response.status_code == 200
    kinds = re.findall(r"^event: (\S+)", response.text, flags=re.MULTILINE)
    assert "response.completed" not in kinds and kinds[-1] == "error"
    assert '"memory_not_recorded"' in response.text.rstrip().rsplit("\n", 1)[-1]
    assert stored_log(redis_server, api_key, session_id) == []


def test_a_stream_whose_turn_cannot_be_stored_ends_with_an_error_not_completed(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    with running_redis() as redis_server:
        gateway = make_gateway(redis_url=redis_server.url, redis={"record_retry_s": 0.3})
        client = sdk(gateway, api_key, session_id)
        warm = list(client.responses.create(model="fake-model", input="warm up", stream=True))
        assert warm[-1].type == "response.completed"
        # Redis dies after the load, while the answer streams (0.3 s a word).
        killer = threading.Timer(0.4, redis_server.stop, args=(signal.SIGKILL,))
        killer.start()
        raw = client.responses.with_raw_response.create(
            model="slow-stream", input="one two three four", stream=True
        )
        events = list(raw.parse())
        killer.join()
    assert raw.headers["x-memory-status"] == "ok"  # the headers left before the record
    types = [event.type for event in events]
    assert "response.completed" not in types
    assert types[-1] == "error"
    assert events[-1].code == "memory_not_recorded"  # type: ignore[union-attr]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "ack: one two three four"  # the answer itself was relayed


def test_without_a_session_the_request_passes_through_untouched(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str
) -> None:
    client = sdk(gateway, api_key, None)
    raw = client.responses.with_raw_response.create(
        model="fake-model", input="hello there", previous_response_id="resp_9"
    )
    assert raw.headers["x-memory-status"] == "off"
    assert raw.parse().output_text == "ack: hello there"
    body = last_forwarded(fake_upstream)
    assert body == {"model": "fake-model", "input": "hello there", "previous_response_id": "resp_9"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "fake-model"}, "input"),
        ({"model": "fake-model", "input": 5}, "input"),
        ({"model": "fake-model", "input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
        (
            {"model": "fake-model", "input": [{"type": "function_call", "name": "f"}]},
            "input.0.call_id",
        ),
        (
            {
                "model": "fake-model",
                "input": [{"role": "user", "content": [{"type": "input_text"}]}],
            },
            "input.0.content.0.text",
        ),
        ({"model": 7, "input": "hi"}, "model"),
        ({"model": "fake-model", "input": "hi", "stream": "yes"}, "stream"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    gateway: ServerThread, api_key: str, session_id: str, body: dict[str, Any], param: str
) -> None:
    headers = {"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id}
    response = httpx.post(gateway.url + "/v1/responses", json=body, headers=headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert json.loads(response.text)["error"]["type"] == "invalid_request_error"


def test_redis_down_serves_degraded_then_memory_resumes(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    with running_redis(appendonly=True) as redis_server:
        gateway = make_gateway(redis_url=redis_server.url)
        client = sdk(gateway, api_key, session_id)
        client.responses.create(model="fake-model", input="my tea is oolong")

        redis_server.stop()
        raw = client.responses.with_raw_response.create(model="fake-model", input="What is my tea?")
        assert raw.headers["x-memory-status"] == "degraded"
        assert raw.parse().output_text == "I don't know your tea."
        forwarded = fake_upstream.responses_requests()[-1]
        assert forwarded.json() == {"model": "fake-model", "input": "What is my tea?"}
        assert "x-session-id" not in forwarded.headers

        redis_server.start()  # same port, same AOF directory
        again = client.responses.with_raw_response.create(
            model="fake-model", input="What is my tea?"
        )
        assert again.headers["x-memory-status"] == "ok"
        assert again.parse().output_text == "Your tea is oolong."


def test_read_mode_injects_memory_and_records_nothing(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    sdk(gateway, api_key, session_id).responses.create(model="fake-model", input="my car is blue")
    reader = sdk(gateway, api_key, session_id, **{"X-Memory-Mode": "read"})
    raw = reader.responses.with_raw_response.create(model="fake-model", input="What is my car?")
    assert raw.headers["x-memory-status"] == "ok"
    assert raw.parse().output_text == "Your car is blue."
    assert len(stored_log(redis_server, api_key, session_id)) == 2


def test_a_session_grown_past_a_small_model_is_answered_after_one_retry(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    gateway = make_gateway(memory={"preset": "hybrid-recall"})
    Memory(gateway, api_key, session_id).add(200, LONG)
    client = sdk(gateway, api_key, session_id)
    raw = client.responses.with_raw_response.create(model="small-openai", input="what comes next?")
    assert raw.headers["x-memory-status"] == "ok"
    assert raw.parse().output_text == "ack: what comes next?"
    sent = [r.json() for r in fake_upstream.responses_requests()]
    assert len(sent) == 2  # refused as too long, then answered within a budget that fits
    assert (
        prompt_tokens(as_messages(sent[1]))
        <= SMALL_CONTEXT_TOKENS
        < prompt_tokens(as_messages(sent[0]))
    )
    assert stored_log(redis_server, api_key, session_id)[-1]["content"] == "ack: what comes next?"


def test_the_sdks_stream_helper_assembles_the_relayed_events(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    client.responses.create(model="fake-model", input="my band is Blur")
    with client.responses.stream(model="fake-model", input="What is my band?") as stream:
        final = stream.get_final_response()
    assert final.output_text == "Your band is Blur."
    assert final.status == "completed"


_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
_WORDS = st.sampled_from(
    ["message", "user", "assistant", "developer", "function_call", "function_call_output",
     "reasoning", "input_text", "output_text", "input_image", "call_1", "hello"]
)  # fmt: skip
_FIELDS = st.sampled_from(
    ["type", "role", "content", "call_id", "name", "arguments", "output", "text", "image_url"]
)
_PARTS = st.lists(st.dictionaries(_FIELDS, _WORDS | _VALUE, max_size=3), max_size=2)
_ITEMS = st.lists(st.dictionaries(_FIELDS, _WORDS | _PARTS | _VALUE, max_size=5), max_size=4)
_BODIES = st.fixed_dictionaries(
    {"model": st.just("fake-model") | _VALUE, "input": st.text(max_size=8) | _ITEMS | _VALUE},
    optional={"stream": st.booleans() | _VALUE, "instructions": st.text(max_size=8) | _VALUE,
              "previous_response_id": st.text(max_size=8) | _VALUE},
)  # fmt: skip


def test_any_body_is_answered_or_refused_with_an_envelope_never_a_500(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    headers = {"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id}
    statuses: Counter[int] = Counter()

    @hyp_settings(max_examples=120, deadline=None, database=None)
    @given(body=_BODIES)
    def one(body: dict[str, Any]) -> None:
        response = http.post("/v1/responses", json=body, headers=headers)
        statuses[response.status_code] += 1
        assert response.status_code < 500, (body, response.text)
        if response.status_code >= 400:
            error = response.json()["error"]
            assert isinstance(error["message"], str) and set(error) >= {"type", "param"}

    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        one()
    assert statuses[200] and statuses[400], statuses


def test_a_function_call_output_must_answer_a_call_memory_holds(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    client.responses.create(model="fake-model", input="hello")
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(
            model="fake-model",
            input=[{"type": "function_call_output", "call_id": "call_9", "output": "x"}],
        )
    assert "call_9" in str(raised.value)
    assert len(stored_log(redis_server, api_key, session_id)) == 2


def _function_call(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "get_weather",
            "arguments": '{"city": "Paris"}'}  # fmt: skip


def test_a_function_call_must_be_answered_once_in_the_input(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    """Stored, an unanswered or repeated call would be forwarded on every later turn, and
    OpenAI refuses such a history: the whole session would fail."""
    headers = {"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id}
    url = gateway.url + "/v1/responses"
    ask = {"role": "user", "content": "Weather in Paris?"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
    refused = {
        "input.1": [ask, _function_call("c1"), {"role": "user", "content": "y"}],
        "input.2": [ask, _function_call("c1"), _function_call("c1"), output],
    }
    for param, items in refused.items():
        response = httpx.post(url, json={"model": "fake-model", "input": items}, headers=headers)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param)
        assert "'c1'" in error["message"]
    assert stored_log(redis_server, api_key, session_id) == []

    # Answered once, the call is kept with its output and sent again on the next turn.
    client = sdk(gateway, api_key, session_id)
    answered_pair: Any = [ask, _function_call("c1"), output]
    client.responses.create(model="fake-model", input=answered_pair)
    log = stored_log(redis_server, api_key, session_id)
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "assistant"]
    assert log[1]["tool_calls"][0]["id"] == log[2]["tool_call_id"] == "c1"
    client.responses.create(model="fake-model", input="and tomorrow?")
    items = last_forwarded(fake_upstream)["input"]
    answered = [(i.get("type"), i.get("call_id")) for i in items if "call_id" in i]
    assert answered == [("function_call", "c1"), ("function_call_output", "c1")]


def test_with_gateway_keys_responses_follow_the_allowlist(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    # One upstream account behind every tenant: responses live there, so the default
    # allowlist of gateway keys (the stateless endpoints) leaves them out, memory or not.
    assert not any(path.startswith("responses") for path in STATELESS_PATHS)
    keys = {"mode": "keys", "keys": [{"key": api_key, "tenant": "team-a"}]}
    closed = make_gateway(auth=keys, upstream={"passthrough": list(STATELESS_PATHS)})
    headers = {"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id}
    body = {"model": "fake-model", "input": "hello"}
    refused = httpx.post(closed.url + "/v1/responses", json=body, headers=headers)
    assert refused.status_code == 405, refused.text
    assert refused.json()["error"]["code"] == "path_not_allowed"
    assert fake_upstream.responses_requests() == []

    opened = make_gateway(auth=keys, upstream={"passthrough": ["responses"]})
    answered = httpx.post(opened.url + "/v1/responses", json=body, headers=headers)
    assert answered.status_code == 200, answered.text
    assert answered.headers["x-memory-status"] == "ok"


def test_an_input_image_is_remembered_and_sent_back_as_an_input_image(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    url = f"data:image/png;base64,{PNG_1PX}"
    client = sdk(gateway, api_key, session_id)
    client.responses.create(
        model="fake-model",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": url, "detail": "low"},
                ],
            }
        ],
    )
    client.responses.create(model="fake-model", input="and now?")
    first = last_forwarded(fake_upstream)["input"][0]
    assert first["content"] == [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": url, "detail": "low"},
    ]


def test_the_context_preview_takes_a_responses_body_and_answers_in_its_terms(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    api_key: str,
    session_id: str,
) -> None:
    client = sdk(gateway, api_key, session_id)
    client.responses.create(model="fake-model", input="my city is Lyon")
    sent = len(fake_upstream.responses_requests())
    preview = {
        "model": "fake-model",
        "instructions": "Answer briefly.",
        "previous_response_id": "resp_123",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "my city?"}]}],
    }
    headers = {"Authorization": f"Bearer {api_key}"}
    url = f"{gateway.url}/memory/sessions/{session_id}/context"
    answer = httpx.post(url, json=preview, headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert "messages" not in body and body["receipt"]["total_tokens"] > 0
    # Exactly the items the proxy would forward: the remembered turn, then the new one.
    assert forwarded_texts({"input": body["input"]})[-3:] == [
        "my city is Lyon",
        "ack: my city is Lyon",
        "my city?",
    ]
    assert all(item.get("type") == "message" for item in body["input"])
    assert len(fake_upstream.responses_requests()) == sent  # a preview forwards nothing
    # A bad item is named as the client sent it.
    preview["input"] = [
        {"role": "user", "content": [{"type": "input_image", "image_url": "file:///x"}]}
    ]
    refused = httpx.post(url, json=preview, headers=headers, timeout=10)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "input.0.content.0.image_url"


def test_a_function_call_never_answered_does_not_break_the_next_turns(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    called = client.responses.create(model="tool-caller", input="weather in Paris?")
    assert [item.type for item in called.output] == ["function_call"]
    client.responses.create(model="fake-model", input="never mind, my city is Lyon")
    answer = client.responses.create(model="fake-model", input="what is my city?")
    assert answer.output_text == "Your city is Lyon."
    forwarded = last_forwarded(fake_upstream)
    assert not [item for item in forwarded["input"] if item.get("type") == "function_call"]


def test_parts_only_the_responses_api_has_do_not_break_a_chat_turn(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    """A session may mix both APIs: an image by file id, and an image a function returned,
    are not chat content; a chat request sends them as text (red-team finding)."""
    client = sdk(gateway, api_key, session_id)
    client.responses.create(
        model="fake-model",
        input=[
            {"role": "user", "content": [
                {"type": "input_text", "text": "my pet is Tom, see"},
                {"type": "input_image", "file_id": "file-abc", "detail": "auto"},
            ]},
            {"type": "function_call", "call_id": "c9", "name": "screenshot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c9", "output": [
                {"type": "input_image", "image_url": "https://example.com/shot.png"},
            ]},
        ],
    )  # fmt: skip
    for _ in range(2):  # and at the turn after: nothing stored is refused
        assert say(client, "What is my pet?") == "Your pet is Tom."
    parts = [
        part
        for message in fake_upstream.last_messages()
        if isinstance(message["content"], list)
        for part in message["content"]
    ]
    assert {"type": "text", "text": "[input_image file-abc]"} in parts
    assert {"type": "text", "text": "[image https://example.com/shot.png]"} in parts
