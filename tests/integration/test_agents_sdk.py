"""The OpenAI Agents SDK through the gateway's ``/v1/responses`` (issue 34): an app that
keeps its own history resends ``result.to_input_list()`` every turn, earlier answers and
function calls as full items with the upstream's ids. Each turn must store its own
messages once, and send upstream each earlier message once.
"""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, TResponseInputItem, function_tool

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess
from devsupport.stored import stored_log
from gateway.memory.model import content_text
from tests.support.clients import register_content

QUESTIONS = ["my favourite colour is teal", "my cat is called Miso", "what is my favourite colour?"]
ANSWERS = ["ack: my favourite colour is teal", "ack: my cat is called Miso",
           "Your favourite colour is teal."]  # fmt: skip
# Nothing leaves for OpenAI's trace exporter.
NO_TRACES = RunConfig(tracing_disabled=True)


def agent(client: Any, model: str = "fake-model", **fields: Any) -> Agent[Any]:
    return Agent(
        name="assistant",
        instructions="Answer briefly.",
        model=OpenAIResponsesModel(model, client),
        **fields,
    )


async def run(assistant: Agent[Any], history: list[TResponseInputItem], stream: bool) -> Any:
    if not stream:
        return await Runner.run(assistant, history, run_config=NO_TRACES)
    result = Runner.run_streamed(assistant, history, run_config=NO_TRACES)
    async for _ in result.stream_events():
        pass
    return result


def forwarded_texts(fake: FakeUpstream) -> list[list[str]]:
    """Each forwarded request's message texts, in order."""
    turns = []
    for request in fake.responses_requests():
        items = request.json()["input"]
        turns.append([content_text(i["content"]) for i in items if i.get("type") == "message"])
    return turns


@pytest.mark.parametrize("stream", [False, True])
async def test_a_resent_input_list_is_stored_once(
    async_openai: Any,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    stream: bool,
) -> None:
    assistant = agent(async_openai)
    history: list[TResponseInputItem] = []
    for question in QUESTIONS:
        history.append({"role": "user", "content": register_content(question)})
        result = await run(assistant, history, stream)
        history = result.to_input_list()
    assert [item.get("id", "")[:4] for item in history if item.get("role") == "assistant"] == [
        "msg_"
    ] * 3  # resent with the upstream's ids
    assert result.final_output == ANSWERS[-1]
    log = stored_log(redis_server, api_key, session_id)
    expected = [m for pair in zip(QUESTIONS, ANSWERS, strict=True) for m in pair]
    assert [content_text(m["content"]) for m in log] == expected
    # Each turn forwarded each earlier message once.
    turns = forwarded_texts(fake_upstream)
    assert turns == [expected[: 2 * n + 1] for n in range(3)]


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


async def test_function_calls_resent_with_their_ids_line_up(
    async_openai: Any, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    # tool-caller calls get_weather, then answers from its output (its calls are all
    # call_1: one turn of it, the later ones of fake-model).
    weather = agent(async_openai, "tool-caller", tools=[get_weather])
    history: list[TResponseInputItem] = [
        {"role": "user", "content": register_content("weather in Paris?")}
    ]
    history = (await run(weather, history, stream=False)).to_input_list()
    for question in QUESTIONS[:2]:
        history.append({"role": "user", "content": register_content(question)})
        history = (await run(agent(async_openai), history, stream=True)).to_input_list()
    calls = [item for item in history if item.get("type") == "function_call"]
    assert len(calls) == 1 and str(calls[0].get("id")).startswith("fc_")
    log = stored_log(redis_server, api_key, session_id)
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "assistant"] + [
        "user",
        "assistant",
    ] * 2
    assert log[3]["content"] == "The tool said: sunny in Paris"
    assert [content_text(m["content"]) for m in log[4:]] == [
        QUESTIONS[0],
        ANSWERS[0],
        QUESTIONS[1],
        ANSWERS[1],
    ]
