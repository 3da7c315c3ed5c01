"""Function names held to OpenAI's ^[a-zA-Z0-9_-]{1,64}$: a tool's in the request, a
call's in the history memory is about to keep, never one memory already holds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.dialects.chat.request import Limits, parse_chat_request
from gateway.dialects.responses.dialect import parse_responses_request
from gateway.dialects.tool_names import is_function_name
from gateway.errors import InvalidRequest
from gateway.routes.memory_api import parse_import

USER = {"role": "user", "content": "weather?"}
BAD = ["weather.get", "get weather", "", "x" * 65, "naïve", "a/b", "f\n", 5, None]


def call(name: Any, call_id: str = "c1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def asked(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def result(call_id: str = "c1") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "sunny"}


def chat(messages: list[dict[str, Any]], **fields: Any) -> Any:
    body = {"model": "m", "messages": messages, **fields}
    return parse_chat_request(json.dumps(body).encode(), Limits())


def responses(items: Any, **fields: Any) -> Any:
    body = {"model": "m", "input": items, **fields}
    return parse_responses_request(json.dumps(body).encode(), Limits())


def test_the_rule_is_openais() -> None:
    for good in ["get_weather", "a", "A-Z_0-9", "x" * 64, "ns__tool-2"]:
        assert is_function_name(good), good
    for bad in BAD:
        assert not is_function_name(bad), bad


@pytest.mark.parametrize("name", ["weather.get", "", "x" * 65, "a b"])
@pytest.mark.parametrize(
    ("field", "param"),
    [
        ("tools", "tools.1.function.name"),
        ("custom", "tools.1.custom.name"),
        ("functions", "functions.1.name"),
    ],
)
def test_a_chat_requests_tools_are_named_by_the_rule(name: str, field: str, param: str) -> None:
    if field == "functions":
        fields: dict[str, Any] = {"functions": [{"name": "ok"}, {"name": name}]}
    else:
        kind = "function" if field == "tools" else "custom"
        good = {"type": kind, kind: {"name": "ok"}}
        fields = {"tools": [good, {"type": kind, kind: {"name": name}}]}
    with pytest.raises(InvalidRequest) as error:
        chat([USER], **fields)
    assert error.value.param == param and error.value.code == "invalid_value"
    assert error.value.status == 400


def test_good_and_unnamed_tools_pass() -> None:
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {}}},
        {"type": "custom", "custom": {"name": "grep-2"}},
        {"type": "web_search"},  # no name: not the gateway's to judge
        "not even an object",  # (left to the upstream, as before)
    ]
    chat([USER], tools=tools, functions=[{"name": "legacy_fn"}])
    responses("hi", tools=[{"type": "function", "name": "f-1"}, {"type": "mcp", "x": 1}])


@pytest.mark.parametrize("kind", ["function", "custom"])
def test_a_responses_requests_tools_are_named_by_the_rule(kind: str) -> None:
    tools = [{"type": kind, "name": "ok"}, {"type": kind, "name": "weather.get"}]
    with pytest.raises(InvalidRequest) as error:
        responses("hi", tools=tools)
    assert error.value.param == "tools.1.name" and error.value.code == "invalid_value"


def test_a_new_call_in_the_chat_history_is_refused_naming_it() -> None:
    request = chat(
        [USER, asked(call("get_weather", "c0"), call("weather.get")), result("c0"), result()]
    )
    with pytest.raises(InvalidRequest) as error:
        request.check_recorded(request.messages)  # all new: a session's first turn
    assert error.value.param == "messages.1.tool_calls.1.function.name"
    assert error.value.code == "invalid_value"


def test_a_call_memory_already_holds_is_not_judged_again() -> None:
    # The stored answer (a model may name a tool it was never given) sent back with the
    # history: only the tool result is new, and the session goes on.
    request = chat([USER, asked(call("weather.get")), result()])
    request.check_recorded(request.messages[2:])
    with pytest.raises(InvalidRequest):
        request.check_recorded(request.messages[1:])


def test_new_is_counted_from_the_end_past_the_prompt() -> None:
    system = {"role": "system", "content": "be brief"}
    request = chat([system, USER, asked(call("a.b")), result(), USER])
    with pytest.raises(InvalidRequest) as error:
        request.check_recorded(request.messages[2:])
    assert error.value.param == "messages.2.tool_calls.0.function.name"


def test_a_function_results_name_is_a_function_name() -> None:
    request = chat([USER, {"role": "function", "name": "weather.get", "content": "x"}])
    with pytest.raises(InvalidRequest) as error:
        request.check_recorded(request.messages)
    assert error.value.param == "messages.1.name"
    named = chat([{"role": "user", "content": "x", "name": "Jean Dupont"}])
    named.check_recorded(named.messages)  # a user's name is not a function's


def test_a_new_function_call_item_is_refused_naming_the_item() -> None:
    items = [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c0", "name": "ok", "arguments": "{}"},
        {"type": "function_call", "call_id": "c1", "name": "weather.get", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c0", "output": "x"},
        {"type": "function_call_output", "call_id": "c1", "output": "y"},
    ]
    request = responses(items)
    with pytest.raises(InvalidRequest) as error:
        request.check_recorded(request.messages)
    assert error.value.param == "input.2.name" and error.value.code == "invalid_value"
    request.check_recorded(request.messages[-2:])  # the calls were stored: not judged again


def test_an_import_is_all_new() -> None:
    body = {"messages": [USER, asked(call("weather.get")), result()]}
    with pytest.raises(InvalidRequest) as error:
        parse_import(json.dumps(body).encode(), Limits())
    assert error.value.param == "messages.1.tool_calls.0.function.name"
    body = {"messages": [USER, asked(call("get_weather")), result()]}
    assert len(parse_import(json.dumps(body).encode(), Limits())) == 3
