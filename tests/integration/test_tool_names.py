"""Function names through the app: a client's bad name is OpenAI's 400 before anything
goes upstream or into memory; a name memory already holds never refuses the session."""

from __future__ import annotations

from typing import Any

import httpx

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import ServerThread

CALL = {"id": "call_9", "type": "function", "function": {"name": "weather.get", "arguments": "{}"}}
QUESTION = {"role": "user", "content": "weather in Paris?"}


def envelope(response: httpx.Response, param: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_value"
    assert error["param"] == param and "is not a function name" in error["message"]


def post(gateway: ServerThread, key: str, session: str, path: str, body: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "X-Session-Id": session}
    return httpx.post(gateway.url + path, json=body, headers=headers, timeout=30)


def test_a_bad_name_the_client_sends_is_refused_before_the_upstream_and_memory(
    gateway: ServerThread, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    tool = {"type": "function", "function": {"name": "get weather", "parameters": {}}}
    chat = {"model": "fake-model", "messages": [QUESTION], "tools": [tool]}
    envelope(
        post(gateway, api_key, session_id, "/v1/chat/completions", chat), "tools.0.function.name"
    )
    asked = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    result = {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}
    history = {"model": "fake-model", "messages": [QUESTION, asked, result]}
    envelope(
        post(gateway, api_key, session_id, "/v1/chat/completions", history),
        "messages.1.tool_calls.0.function.name",
    )
    items = [
        QUESTION,
        {"type": "function_call", "call_id": "call_9", "name": "weather.get", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_9", "output": "sunny"},
    ]
    responses = {"model": "fake-model", "input": items}
    envelope(post(gateway, api_key, session_id, "/v1/responses", responses), "input.1.name")
    tools = {"model": "fake-model", "input": "hi", "tools": [{"type": "function", "name": "a.b"}]}
    envelope(post(gateway, api_key, session_id, "/v1/responses", tools), "tools.0.name")
    assert fake_upstream.proxied_requests() == []
    stored = httpx.get(
        f"{gateway.url}/memory/sessions/{session_id}",
        headers={"Authorization": f"Bearer {api_key}"},
    )
    assert stored.status_code == 404, stored.text  # nothing of it was kept


def test_a_name_an_answer_made_up_does_not_refuse_the_session_sent_back(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    # The upstream's answer calls "weather.get" (a model may name a tool it was never
    # given): memory keeps it as it came, and a client sending its whole history back,
    # that call in it, goes on.
    first = {"model": "dotted-tool-caller", "messages": [QUESTION]}
    asked = post(gateway, api_key, session_id, "/v1/chat/completions", first)
    assert asked.status_code == 200, asked.text
    message = asked.json()["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "weather.get"
    result = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "42"}
    again = {"model": "dotted-tool-caller", "messages": [QUESTION, message, result]}
    answered = post(gateway, api_key, session_id, "/v1/chat/completions", again)
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["content"] == "The tool said: 42"
