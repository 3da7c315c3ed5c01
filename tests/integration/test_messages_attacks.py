"""``POST /v1/messages`` attacked as a hostile or careless client (or upstream) would: a
bad body gets a 4xx in Anthropic's envelope before anything goes upstream, a malformed
stream never crashes the relay and is never acknowledged as stored, what another API
stored is sent in a shape the real Messages API takes, and a gateway key reaches no
other tenant's state upstream. Against the fake upstream (``devsupport/fake_anthropic``:
its ``scripted`` answers break the API's rules on purpose), real Redis."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess, ServerThread
from devsupport.stored import roles_and_text, stored_log
from tests.support.anthropic_events import CALL, START, STOP, delta, event, piece, text_block
from tests.support.fixtures import GatewayFactory
from tests.support.images import PNG_1PX

# What Anthropic's API takes as a tool_use id (it refuses others with a 400).
TOOL_ID = re.compile(r"[a-zA-Z0-9_-]+")


def post(
    gateway: ServerThread,
    key: str,
    session: str | None,
    body: Any,
    path: str = "/v1/messages",
) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}
    if session is not None:
        headers["x-session-id"] = session
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        return http.post(path, json=body, headers=headers)


def ask(text: str, model: str = "claude-fake", **fields: Any) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 50,
        "messages": [{"role": "user", "content": text}],
        **fields,
    }


def stored(redis_server: RedisProcess, key: str, session: str) -> list[dict[str, Any]]:
    try:
        return stored_log(redis_server, key, session)
    except AssertionError:  # no tenant secret yet: nothing was ever stored
        return []


def events(body: bytes) -> list[str]:
    """The type of each event of a relayed stream, in order."""
    return re.findall(r"^event: (\S+)", body.decode("utf-8", "replace"), re.MULTILINE)


TEXT = text_block("hello there")
MALFORMED_STREAMS = {
    "a usage that is not an object": event("message_start", message={"usage": "ab"})
    + TEXT
    + delta("end_turn")
    + STOP,
    "a block index that is not a number": START
    + TEXT.replace(b'"index": 0', b'"index": "x"')
    + delta("end_turn")
    + STOP,
    "a stop reason that is not a string": START + TEXT + delta(["end_turn"]) + STOP,
    "message_stop with no stop reason": START
    + TEXT
    + event("message_delta", delta={}, usage={"output_tokens": 3})
    + STOP,
    "message_stop with no message_delta": START + TEXT + STOP,
    "a tool input that is not JSON": START
    + CALL
    + piece('{"city": Par')
    + delta("tool_use")
    + STOP,
    "a tool input that is not an object": START + CALL + piece("[1, 2]") + delta("tool_use") + STOP,
    "a delta for a block never started": START
    + event("content_block_delta", index=3, delta={"type": "text_delta", "text": "x"})
    + TEXT
    + delta("end_turn")
    + STOP,
    "bytes that are not UTF-8": START
    + TEXT.replace(b"hello", b"h\xffllo")
    + delta("end_turn")
    + STOP,
}


@pytest.mark.parametrize("stream", list(MALFORMED_STREAMS.values()), ids=list(MALFORMED_STREAMS))
def test_a_malformed_stream_is_relayed_whole_and_not_acknowledged_as_stored(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    stream: bytes,
) -> None:
    fake_upstream.anthropic.scripted["broken"] = ("text/event-stream", stream)
    # The gateway never fails in mid-stream: the answer reaches the client to its end.
    sent = post(gateway, api_key, session_id, ask("hi there friend", "broken", stream=True))
    assert sent.status_code == 200
    assert sent.content.startswith(stream.rsplit(STOP, 1)[0])  # relayed as it came
    seen = events(sent.content)
    # Not stored, so not acknowledged: an error event where message_stop would be.
    assert seen[-1] == "error", seen
    assert seen.count("message_stop") <= 1 and "message_stop" not in seen[seen.index("error") :]
    assert stored(redis_server, api_key, session_id) == []


def test_a_whole_answer_whose_stop_reason_is_not_a_string_is_relayed_not_a_500(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    answer = {
        "type": "message",
        "role": "assistant",
        "stop_reason": ["end_turn"],
        "content": [{"type": "text", "text": "yo"}],
    }
    fake_upstream.anthropic.scripted["broken"] = ("application/json", json.dumps(answer).encode())
    sent = post(gateway, api_key, session_id, ask("hi there friend", "broken"))
    assert sent.status_code == 200, sent.text
    assert sent.json() == answer
    assert sent.headers["x-memory-status"] == "not_recorded"
    assert stored(redis_server, api_key, session_id) == []


@pytest.mark.parametrize("streamed", [False, True])
def test_an_answer_cut_by_the_context_window_is_remembered(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    streamed: bool,
) -> None:
    # A stop reason of the current API (the SDK knows it): an answer the client read
    # whole, acknowledged as stored, so it must be.
    reason = "model_context_window_exceeded"
    if streamed:
        scripted = ("text/event-stream", START + TEXT + delta(reason) + STOP)
    else:
        answer = {"type": "message", "role": "assistant", "stop_reason": reason,
                  "content": [{"type": "text", "text": "hello there"}]}  # fmt: skip
        scripted = ("application/json", json.dumps(answer).encode())
    fake_upstream.anthropic.scripted["long"] = scripted
    sent = post(gateway, api_key, session_id, ask("hi there friend", "long", stream=streamed))
    assert sent.status_code == 200
    if streamed:
        assert events(sent.content)[-1] == "message_stop"
    else:
        assert sent.headers["x-memory-status"] == "ok"
    assert roles_and_text(stored(redis_server, api_key, session_id)) == [
        ("user", "hi there friend"),
        ("assistant", "hello there"),
    ]


def test_an_upstream_that_answers_json_to_a_stream_is_a_502_in_anthropics_envelope(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    fake_upstream.anthropic.scripted["plain"] = ("application/json", b'{"type":"message"}')
    sent = post(gateway, api_key, session_id, ask("hi there friend", "plain", stream=True))
    assert sent.status_code == 502
    assert sent.json()["type"] == "error" and sent.json()["error"]["type"] == "api_error"
    assert stored(redis_server, api_key, session_id) == []


def tool_turn(tool_use: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": [tool_use]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18C"}],
        },
    ]


REFUSED_BODIES = {
    "an empty message": ([{"role": "user", "content": []}], "messages.0"),
    "an empty string": ([{"role": "user", "content": ""}], "messages.0"),
    "only whitespace": ([{"role": "user", "content": "  \n "}], "messages.0.content"),
    "a blank text block": (
        [{"role": "user", "content": [{"type": "text", "text": " "}]}],
        "messages.0.content.0.text",
    ),
    "an image said by the assistant": (
        [
            {"role": "user", "content": "look at this"},
            {
                "role": "assistant",
                "content": [
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
                ],
            },
            {"role": "user", "content": "what did you show me?"},
        ],
        "messages.1.content.0.type",
    ),
    "a tool result said by the assistant": (
        [
            {"role": "user", "content": "first question"},
            {
                "role": "assistant",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18C"}],
            },
            {"role": "user", "content": "second question"},
        ],
        "messages.1.content.0.type",
    ),
    "a tool call said by the user": (
        [
            {
                "role": "user",
                "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}],
            }
        ],
        "messages.0.content.0.type",
    ),
    "a tool input that is not an object": (
        tool_turn({"type": "tool_use", "id": "t1", "name": "get_weather", "input": "Paris"}),
        "messages.1.content.0.input",
    ),
}


@pytest.mark.parametrize(
    ("messages", "param"), list(REFUSED_BODIES.values()), ids=list(REFUSED_BODIES)
)
def test_a_body_the_api_refuses_is_refused_before_memory_or_the_upstream_sees_it(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    messages: list[dict[str, Any]],
    param: str,
) -> None:
    # Forwarded, each became another request (an empty turn dropped, an assistant's
    # blocks lost), which the upstream answered and memory stored.
    sent = post(gateway, api_key, session_id, {**ask(""), "messages": messages})
    assert sent.status_code == 400, sent.text
    error = sent.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(param + ":"), error
    assert fake_upstream.messages_requests() == []
    assert stored(redis_server, api_key, session_id) == []


def chat(gateway: ServerThread, key: str, session: str, messages: list[dict[str, Any]]) -> None:
    sent = post(
        gateway,
        key,
        session,
        {"model": "fake-model", "messages": messages},
        path="/v1/chat/completions",
    )
    assert sent.status_code == 200, sent.text


def forwarded(fake: FakeUpstream) -> dict[str, Any]:
    return dict(fake.messages_requests()[-1].json())


def test_blank_messages_chat_stored_do_not_break_the_session_for_messages(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    # Chat takes blank content; Anthropic refuses a blank text block: sent on as stored,
    # every later Messages turn of the session was refused.
    chat(gateway, api_key, session_id, [
        {"role": "user", "content": "my seat is 14C"},
        {"role": "assistant", "content": " "},
        {"role": "user", "content": "  "},
    ])  # fmt: skip
    sent = post(gateway, api_key, session_id, ask("What is my seat?"))
    assert sent.status_code == 200, sent.text
    assert sent.json()["content"][0]["text"] == "Your seat is 14C."
    blocks = [b for m in forwarded(fake_upstream)["messages"] for b in m["content"]]
    assert all(b["text"].strip() for b in blocks if b["type"] == "text")


def test_a_chat_tool_call_goes_to_anthropic_with_an_id_it_takes(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    # Ids as vLLM / Kimi-style servers make them: chat takes any string.
    calls = ["functions.get_weather:0", "functions.get_weather:1"]
    chat(gateway, api_key, session_id, [
        {"role": "user", "content": "weather in Paris and Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
            for call, city in zip(calls, ["Paris", "Oslo"], strict=True)
        ]},
        {"role": "tool", "tool_call_id": calls[0], "content": "18C"},
        {"role": "tool", "tool_call_id": calls[1], "content": "3C"},
    ])  # fmt: skip
    sent = post(gateway, api_key, session_id, ask("and tomorrow?"))
    assert sent.status_code == 200, sent.text
    messages = forwarded(fake_upstream)["messages"]
    uses = [b["id"] for m in messages for b in m["content"] if b["type"] == "tool_use"]
    results = [
        b["tool_use_id"] for m in messages for b in m["content"] if b["type"] == "tool_result"
    ]
    assert len(set(uses)) == 2 and uses == results
    assert all(TOOL_ID.fullmatch(i) for i in uses), uses


def test_a_chat_text_file_goes_to_anthropic_as_a_document_it_takes(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    # Anthropic's base64 document source takes a PDF only: a text file goes as text.
    chat(gateway, api_key, session_id, [{"role": "user", "content": [
        {"type": "text", "text": "read my notes"},
        {"type": "file", "file": {"file_data": "data:text/plain;base64,c2VhdCAxNEM=",
                                  "filename": "notes.txt"}},
    ]}])  # fmt: skip
    sent = post(gateway, api_key, session_id, ask("what was in it?"))
    assert sent.status_code == 200, sent.text
    documents = [
        b for m in forwarded(fake_upstream)["messages"] for b in m["content"]
        if b["type"] == "document"
    ]  # fmt: skip
    assert [d["source"] for d in documents] == [
        {"type": "text", "media_type": "text/plain", "data": "seat 14C"}
    ]


def test_the_requests_own_cache_mark_counts_among_the_four(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(memory={"stable_layout": True})
    system = [
        {"type": "text", "text": f"rule {i}", "cache_control": {"type": "ephemeral"}}
        for i in range(3)
    ]
    for question in ("my seat is 14C", "What is my seat?"):
        body = ask(question, system=system, cache_control={"type": "ephemeral"})
        sent = post(gateway, api_key, session_id, body)
        # Anthropic refuses a fifth mark: every turn after the first was refused.
        assert sent.status_code == 200, sent.text
    assert json.dumps(forwarded(fake_upstream)).count('"cache_control"') <= 4


def test_a_gateway_key_reaches_no_batch_of_the_operators_anthropic_account(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # With gateway keys every tenant's request carries the one operator key: batches
    # (created, listed, their results read) are the account's, every tenant's at once,
    # as files and batches of the OpenAI API are (STATELESS_PATHS only, there).
    key = "gw-key-claude-0123456789"
    gateway = make_gateway(
        auth={"mode": "keys", "keys": [{"key": key, "tenant": "team-c"}]},
        upstream={"anthropic_api_key": "sk-ant-operator-0123"},
    )
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=gateway.url) as http:
        listed = http.get("/v1/messages/batches", headers=headers)
        results = http.get("/v1/messages/batches/msgbatch_01/results", headers=headers)
        counted = http.post("/v1/messages/count_tokens", headers=headers, json=ask("x"))
    for refused in (listed, results):
        assert refused.status_code == 405, refused.text
        assert refused.json()["type"] == "error"
    assert counted.status_code == 200  # stateless: the account's key does no harm there


def test_an_x_api_key_opens_no_openai_route_and_client_headers_stay_home(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    with httpx.Client(base_url=gateway.url) as http:
        chat_call = http.post(
            "/v1/chat/completions",
            json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-api-key": api_key},
        )
        sent = http.post(
            "/v1/messages",
            json=ask("my seat is 14C"),
            headers={
                "x-api-key": api_key,
                "anthropic-version": "2023-06-01",
                "x-session-id": session_id,
                "cookie": "session=abc",
                "x-forwarded-for": "10.0.0.7",
                "x-real-ip": "10.0.0.7",
            },
        )
    assert chat_call.status_code == 401  # as before: OpenAI's routes read Authorization only
    assert sent.status_code == 200, sent.text
    upstream = fake_upstream.messages_requests()[-1].headers
    assert upstream["x-api-key"] == api_key
    assert not {"cookie", "x-forwarded-for", "x-real-ip", "authorization"} & set(upstream)


def test_a_chat_custom_tool_call_goes_to_anthropic_with_its_name(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    # A custom (free-form) tool's call has no "function": sent with no name, refused on
    # every later Messages turn of the session.
    custom = {"id": "call_1", "type": "custom", "custom": {"name": "run", "input": "ls"}}
    chat(gateway, api_key, session_id, [
        {"role": "user", "content": "list my files"},
        {"role": "assistant", "content": None, "tool_calls": [custom]},
        {"role": "tool", "tool_call_id": "call_1", "content": "notes.txt"},
    ])  # fmt: skip
    sent = post(gateway, api_key, session_id, ask("and now?"))
    assert sent.status_code == 200, sent.text
    uses = [b for m in forwarded(fake_upstream)["messages"] for b in m["content"]
            if b["type"] == "tool_use"]  # fmt: skip
    assert uses == [{"type": "tool_use", "id": "call_1", "name": "run", "input": {"input": "ls"}}]


def test_the_newest_message_reaches_the_model_as_the_client_sent_it(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    # Claude Code's Read of an image, a computer-use screenshot: an image in a tool
    # result, a failed tool's is_error, a document by URL with citations, a search
    # result. Read back from memory, the model was shown "[image]", "[document]" and
    # "[search_result]", and an error as a result.
    screenshot = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                              "data": PNG_1PX}}  # fmt: skip
    newest = [
        {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
         "content": [{"type": "text", "text": "partial capture"}, screenshot]},
        {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"},
         "citations": {"enabled": True}},
        {"type": "search_result", "source": "https://example.com/kb", "title": "Seats",
         "content": [{"type": "text", "text": "row 14 has window seats"}]},
        {"type": "text", "text": "what do you see?"},
    ]  # fmt: skip
    messages = [
        {"role": "user", "content": "take a screenshot"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}
        ]},
        {"role": "user", "content": newest},
    ]  # fmt: skip
    sent = post(gateway, api_key, session_id, {**ask(""), "messages": messages})
    assert sent.status_code == 200, sent.text
    assert forwarded(fake_upstream)["messages"][-1]["content"] == newest
    # On the next turn the screenshot is still an image of its tool result (memory's).
    sent = post(gateway, api_key, session_id, ask("and now?"))
    assert sent.status_code == 200, sent.text
    result = forwarded(fake_upstream)["messages"][2]["content"][0]
    assert result["type"] == "tool_result"
    assert result["content"][1] == screenshot


def test_each_upstream_gets_its_own_operator_key_only(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, session_id: str
) -> None:
    key = "gw-key-both-apis-0123456789"
    gateway = make_gateway(
        auth={"mode": "keys", "keys": [{"key": key, "tenant": "team-d"}]},
        upstream={
            "api_key": "sk-openai-operator-4567",
            "anthropic_api_key": "sk-ant-operator-4567",
        },
    )
    assert post(gateway, key, session_id, ask("my seat is 14C")).status_code == 200
    said = {"model": "fake-model", "messages": [{"role": "user", "content": "my row is 14"}]}
    assert post(gateway, key, session_id, said, path="/v1/chat/completions").status_code == 200
    to_anthropic = fake_upstream.messages_requests()[-1].headers
    to_openai = fake_upstream.chat_requests()[-1].headers
    assert to_anthropic.get("x-api-key") == "sk-ant-operator-4567"
    assert to_openai.get("authorization") == "Bearer sk-openai-operator-4567"
    for headers, foreign in ((to_anthropic, "sk-openai"), (to_openai, "sk-ant")):
        assert all(foreign not in v and key not in v for v in headers.values()), headers
