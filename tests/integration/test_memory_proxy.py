"""The memory proxy end to end: real OpenAI SDK → gateway → real fake upstream, real Redis."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from openai.types.chat import ChatCompletionMessage
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess, ServerThread
from devsupport.stored import roles_and_text, stored_log
from gateway.auth.identity import tenant_id
from gateway.store.keys import TENANT_SECRET_KEY, SessionKeys
from tests.support.clients import say, sdk
from tests.support.fixtures import GatewayFactory, on_one_redis_and_a_cluster

redis_server = on_one_redis_and_a_cluster()


def test_model_remembers_across_turns_when_client_sends_only_new_messages(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = sdk(gateway, api_key, session_id)
    first = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "Hi, my name is Ada."}]
    )
    assert first.headers["x-memory-status"] == "ok"
    assert int(first.headers["x-memory-context-tokens"]) > 0
    assert first.parse().choices[0].message.content == "ack: Hi, my name is Ada."
    say(client, "I like tea.")

    assert say(client, "What is my name?") == "Your name is Ada."
    forwarded = fake_upstream.last_messages()
    assert [m["content"] for m in forwarded][:2] == [
        "Hi, my name is Ada.",
        "ack: Hi, my name is Ada.",
    ]
    assert roles_and_text(stored_log(redis_server, api_key, session_id)) == [
        ("user", "Hi, my name is Ada."),
        ("assistant", "ack: Hi, my name is Ada."),
        ("user", "I like tea."),
        ("assistant", "ack: I like tea."),
        ("user", "What is my name?"),
        ("assistant", "Your name is Ada."),
    ]


def test_streaming_answer_is_relayed_and_recorded(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    say(client, "my city is Lyon")
    stream = client.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "What is my city?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Your city is Lyon."
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 15
    log = stored_log(redis_server, api_key, session_id)
    assert log[-1] == {**log[-1], "role": "assistant", "content": "Your city is Lyon."}
    assert len(log) == 4


def test_stream_is_passed_through_chunk_by_chunk_with_done(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    arrivals: list[float] = []
    raw = b""
    body = {
        "model": "slow-stream",
        "stream": True,
        "messages": [{"role": "user", "content": "a b c d e"}],
    }
    headers = {"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id}
    start = time.monotonic()
    with httpx.stream(
        "POST", gateway.url + "/v1/chat/completions", json=body, headers=headers
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for piece in response.iter_raw():
            arrivals.append(time.monotonic() - start)
            raw += piece
    assert raw.endswith(b"data: [DONE]\n\n")
    # Five words 0.3 s apart: the first must reach us long before the last was produced.
    assert arrivals[-1] - arrivals[0] > 0.9, arrivals


def test_full_history_resend_never_duplicates(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = sdk(gateway, api_key, session_id)
    history: list[dict] = [{"role": "system", "content": "You are terse."}]
    for n in range(6):
        history.append({"role": "user", "content": f"message {n}"})
        answer = client.chat.completions.create(model="fake-model", messages=history)
        history.append({"role": "assistant", "content": answer.choices[0].message.content})
    log = stored_log(redis_server, api_key, session_id)
    assert [m["content"] for m in log] == [m["content"] for m in history[1:]]
    forwarded = fake_upstream.last_messages()
    assert forwarded[0] == {"role": "system", "content": "You are terse."}
    assert sum(1 for m in forwarded if m["role"] == "system") == 1  # system kept once, not stored
    # hybrid keeps the last 8 messages verbatim, then the new one
    assert [m["content"] for m in forwarded[1:]] == [m["content"] for m in history[-10:-1]][-9:]


def test_regenerate_replaces_the_stored_answer(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    turn1 = [{"role": "user", "content": "first"}]
    a1 = (
        client.chat.completions.create(model="fake-model", messages=turn1)
        .choices[0]
        .message.content
    )
    client.chat.completions.create(model="fake-model", messages=turn1)  # regenerate turn 1
    assert roles_and_text(stored_log(redis_server, api_key, session_id)) == [
        ("user", "first"),
        ("assistant", a1),
    ]

    turn2 = [*turn1, {"role": "assistant", "content": a1}, {"role": "user", "content": "second"}]
    client.chat.completions.create(model="fake-model", messages=turn2)
    client.chat.completions.create(model="fake-model", messages=turn2, stream=False)
    list(client.chat.completions.create(model="fake-model", messages=turn2, stream=True))
    log = stored_log(redis_server, api_key, session_id)
    assert roles_and_text(log) == [
        ("user", "first"),
        ("assistant", a1),
        ("user", "second"),
        ("assistant", "ack: second"),
    ]


def test_single_message_client_repeating_itself_is_a_new_turn(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    for text in ("hello", "continue", "continue"):
        say(client, text)
    assert [
        m["content"] for m in stored_log(redis_server, api_key, session_id) if m["role"] == "user"
    ] == [
        "hello",
        "continue",
        "continue",
    ]


def test_missed_turns_are_imported_from_a_resent_history(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    client = sdk(gateway, api_key, session_id)
    history = [
        {"role": "user", "content": "my color is teal"},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": "what is my color?"},
    ]
    assert client.chat.completions.create(model="fake-model", messages=history).choices[
        0
    ].message.content == ("Your color is teal.")
    assert [m["content"] for m in stored_log(redis_server, api_key, session_id)] == [
        "my color is teal",
        "noted",
        "what is my color?",
        "Your color is teal.",
    ]


def test_tool_calls_and_results_are_recorded_and_forwarded_together(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = sdk(gateway, api_key, session_id)
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    messages: list = [{"role": "user", "content": "weather in Paris?"}]
    stream = client.chat.completions.create(
        model="tool-caller", messages=messages, tools=tools, stream=True
    )
    calls: dict[int, dict] = {}
    for chunk in stream:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            slot = calls.setdefault(
                call.index, {"id": call.id, "name": call.function.name, "arguments": ""}
            )
            slot["arguments"] += call.function.arguments or ""
    assert calls[0]["arguments"] == '{"city": "Paris"}'
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": calls[0]["arguments"]}}],
    }  # fmt: skip
    messages += [assistant, {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"}]
    final = client.chat.completions.create(model="tool-caller", messages=messages, tools=tools)
    assert final.choices[0].message.content == "The tool said: sunny, 21C"
    forwarded = fake_upstream.last_messages()
    assert [m["role"] for m in forwarded] == ["user", "assistant", "tool"]
    assert forwarded[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    log = stored_log(redis_server, api_key, session_id)
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "assistant"]
    assert log[1]["tool_calls"][0]["id"] == "call_1" and log[2]["tool_call_id"] == "call_1"


def test_a_tool_call_the_app_never_ran_does_not_break_the_next_turns(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    """The model asks for a tool, the user moves on: the call stays in memory, but it is
    not sent again without a result (OpenAI refuses that, at every later turn)."""
    client = sdk(gateway, api_key, session_id)
    asked = client.chat.completions.create(
        model="tool-caller", messages=[{"role": "user", "content": "weather in Paris?"}]
    )
    assert asked.choices[0].message.tool_calls
    for text in ("never mind, my city is Lyon", "what is my city?"):
        answer = client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": text}]
        )
    assert answer.choices[0].message.content == "Your city is Lyon."
    forwarded = fake_upstream.last_messages()
    assert not any(m.get("tool_calls") for m in forwarded)
    assert [m["content"] for m in forwarded if m["role"] == "user"][-3:] == [
        "weather in Paris?",
        "never mind, my city is Lyon",
        "what is my city?",
    ]
    log = stored_log(redis_server, api_key, session_id)
    assert log[1]["tool_calls"][0]["id"] == "call_1"  # memory keeps what the model did


REFUSAL = "I can't help with that."


def _says_something(message: dict) -> bool:
    """What OpenAI takes as an assistant message: content, or tool calls."""
    return message["content"] is not None or bool(message.get("tool_calls"))


def test_a_refused_answer_in_a_resent_history_is_kept_as_its_refusal(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    """A history that holds a refused answer as the SDK returned it (content null, the
    refusal beside it) is stored with the refusal as content, not as an empty message
    OpenAI would refuse on every later turn."""
    client = sdk(gateway, api_key, session_id)
    refused = ChatCompletionMessage(role="assistant", content=None, refusal=REFUSAL)
    history: list[Any] = [
        {"role": "user", "content": "my color is teal; how do I pick a lock?"},
        refused,  # the SDK's own object, as an app appends it
        {"role": "user", "content": "what is my color?"},
    ]
    answer = client.chat.completions.create(model="fake-model", messages=history)
    assert answer.choices[0].message.content == "Your color is teal."
    kept = [{"type": "refusal", "refusal": REFUSAL}]
    log = stored_log(redis_server, api_key, session_id)
    assert [(m["role"], m["content"]) for m in log][:3] == [
        ("user", "my color is teal; how do I pick a lock?"),
        ("assistant", kept),
        ("user", "what is my color?"),
    ]
    assert all(_says_something(m) for m in fake_upstream.last_messages())
    # The whole history again, and a new question: nothing is imported twice, and the
    # refused answer goes out as it was stored.
    history += [answer.choices[0].message, {"role": "user", "content": "and my name?"}]
    client.chat.completions.create(model="fake-model", messages=history)
    assert len(stored_log(redis_server, api_key, session_id)) == 6
    forwarded = fake_upstream.last_messages()
    assert {"role": "assistant", "content": kept} in forwarded
    assert all(_says_something(m) for m in forwarded)


def _refusing_upstream() -> Starlette:
    """An upstream whose model refuses every question, as OpenAI answers a refusal."""

    async def refuse(request: Request) -> JSONResponse:
        message = {"role": "assistant", "content": None, "refusal": REFUSAL}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        return JSONResponse({"id": "chatcmpl-r", "object": "chat.completion", "created": 0,
                             "model": "m", "choices": [choice], "usage": usage})  # fmt: skip

    return Starlette(routes=[Route("/v1/chat/completions", refuse, methods=["POST"])])


def test_a_refused_answer_sent_back_by_the_sdk_is_not_imported_again(
    make_gateway: GatewayFactory, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    """The upstream's refusal is stored as its text; the SDK's copy of it, resent in the
    history, is that same message: the log holds each turn once."""
    with ServerThread(_refusing_upstream()) as upstream:
        gateway = make_gateway(upstream={"base_url": upstream.url + "/v1"})
        client = sdk(gateway, api_key, session_id)
        history: list[Any] = [{"role": "user", "content": "how do I pick a lock?"}]
        for question in ("a safe, then?", "a car?"):
            answer = client.chat.completions.create(model="m", messages=history)
            assert answer.choices[0].message.refusal == REFUSAL
            history += [answer.choices[0].message, {"role": "user", "content": question}]
        client.chat.completions.create(model="m", messages=history)
    assert roles_and_text(stored_log(redis_server, api_key, session_id)) == [
        ("user", "how do I pick a lock?"),
        ("assistant", REFUSAL),
        ("user", "a safe, then?"),
        ("assistant", REFUSAL),
        ("user", "a car?"),
        ("assistant", REFUSAL),
    ]


def test_tenants_are_isolated_under_the_same_session_id(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    other_key = api_key[::-1] + "x"
    from tests.support.fixtures import USED_KEYS

    USED_KEYS.append(other_key)
    say(sdk(gateway, api_key, session_id), "my password is hunter2")
    answer = say(sdk(gateway, other_key, session_id), "What is my password?")
    assert answer == "I don't know your password."
    assert all("hunter2" not in json.dumps(m) for m in fake_upstream.last_messages())


def test_memory_modes_read_and_off(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = sdk(gateway, api_key, session_id)
    say(client, "my pet is Rex")
    reader = sdk(gateway, api_key, session_id, **{"X-Memory-Mode": "read"})
    read = reader.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "what is my pet?"}]
    )
    assert read.parse().choices[0].message.content == "Your pet is Rex."
    assert read.headers["x-memory-status"] == "ok"
    off = sdk(
        gateway, api_key, session_id, **{"X-Memory-Mode": "off"}
    ).chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "what is my pet?"}]
    )
    assert off.parse().choices[0].message.content == "I don't know your pet."
    assert off.headers["x-memory-status"] == "off"
    assert len(stored_log(redis_server, api_key, session_id)) == 2  # read and off recorded nothing


def test_no_session_header_is_a_pure_passthrough(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str
) -> None:
    raw = b'{"model": "fake-model",   "messages": [{"role": "user", "content": "x"}], "seed": 7}'
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        content=raw,
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
    )
    assert response.status_code == 200
    assert response.headers["x-memory-status"] == "off"
    assert fake_upstream.proxied_requests()[-1].body == raw  # byte for byte


def test_require_session_rejects_requests_without_it(
    make_gateway: GatewayFactory, api_key: str
) -> None:
    gateway = make_gateway(server={"require_session": True})
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": "x"}]},
        headers={"Authorization": f"Bearer {api_key}"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "missing_session"


def test_gateway_headers_are_not_forwarded_but_the_key_is(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    say(sdk(gateway, api_key, session_id, **{"X-User-Id": "u1"}), "hi")
    seen = fake_upstream.proxied_requests()[-1].headers
    assert "x-session-id" not in seen and "x-user-id" not in seen
    assert seen["authorization"] == f"Bearer {api_key}"


def test_configured_upstream_key_replaces_the_client_key(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(
        upstream={"api_key": "sk-upstream-configured"},
        auth={"mode": "keys", "keys": [{"key": api_key, "tenant": "team-a"}]},
    )
    say(sdk(gateway, api_key, session_id), "hi")
    assert (
        fake_upstream.proxied_requests()[-1].headers["authorization"]
        == "Bearer sk-upstream-configured"
    )


def test_memory_survives_a_gateway_restart(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    first = make_gateway()
    say(sdk(first, api_key, session_id), "my dog is Fido")
    first.stop()
    second = make_gateway()
    assert say(sdk(second, api_key, session_id), "what is my dog?") == "Your dog is Fido."


def test_user_id_is_stored_with_the_session(
    gateway: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    say(sdk(gateway, api_key, session_id, **{"X-User-Id": "user-42"}), "hi")
    client = redis_server.client()
    keys = SessionKeys(tenant_id(client.get(TENANT_SECRET_KEY), api_key), session_id)
    meta = client.hgetall(keys.meta)
    assert meta[b"user_id"] == b"user-42" and meta[b"sid"] == session_id.encode()
    assert 29 * 86400 < client.ttl(keys.log) <= 30 * 86400  # retention, refreshed on activity
    client.close()
