"""The Responses API on a chat-only upstream (issue 34; ``upstream.responses``): the fake
upstream answers ``/v1/responses`` as llama-cpp-python does (404 ``{"detail": "Not
Found"}``), and the gateway serves the Responses API itself over ``/chat/completions``,
driven by the real OpenAI SDK and the Agents SDK, memory and all."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from agents import TResponseInputItem

from devsupport.fake_upstream import SMALL_CONTEXT_TOKENS, FakeUpstream, prompt_tokens
from devsupport.servers import RedisProcess, ServerThread, running_redis
from devsupport.stored import stored_log
from gateway.memory.model import content_text
from tests.integration import test_vercel_ai as vercel
from tests.integration.test_agents_sdk import ANSWERS, QUESTIONS, agent, get_weather, run
from tests.support.clients import LONG, Memory, register_content, sdk
from tests.support.fixtures import GatewayFactory

CONVERSATION = [m for pair in zip(QUESTIONS, ANSWERS, strict=True) for m in pair]
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def fake_upstream_server() -> Iterator[tuple[FakeUpstream, ServerThread]]:
    """This module's upstream serves chat completions only (overrides the suite's)."""
    fake = FakeUpstream(chat_only=True)
    with ServerThread(fake.app()) as thread:
        yield fake, thread


def chat_requests(fake: FakeUpstream) -> list[Any]:
    """The chat requests the gateway forwarded for its clients (not its summarizer's)."""
    return [r for r in fake.proxied_requests() if r.path == "/v1/chat/completions"]


def chat_texts(fake: FakeUpstream) -> list[list[str]]:
    """Each chat request's user and assistant texts (not the memory block's system one)."""
    return [
        [content_text(m["content"]) for m in r.json()["messages"] if m["role"] != "system"]
        for r in chat_requests(fake)
    ]


def ask(client: openai.OpenAI, question: str, stream: bool) -> tuple[str, Any]:
    """One turn through ``client.responses.create``: the answer's text and its response."""
    kwargs: dict[str, Any] = {"model": "fake-model", "instructions": "Answer briefly."}
    content = register_content(question)
    if not stream:
        response = client.responses.create(input=content, **kwargs)
        return response.output_text, response
    events = list(client.responses.create(input=content, stream=True, **kwargs))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    delta = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    response = events[-1].response
    assert delta == response.output_text
    return delta, response


@pytest.mark.parametrize("mode", ["chat", "auto"])
@pytest.mark.parametrize("stream", [False, True])
def test_the_sdk_is_answered_over_chat_and_remembered(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    mode: str,
    stream: bool,
) -> None:
    client = sdk(make_gateway(upstream={"responses": mode}), api_key, session_id)
    answers = []
    for question in QUESTIONS:
        text, response = ask(client, question, stream)
        assert response.status == "completed" and response.usage.input_tokens > 0
        answers.append(text)
    assert answers == ANSWERS  # the last from memory: the fake answers from its context
    log = stored_log(redis_server, api_key, session_id)
    assert [(m["role"], content_text(m["content"])) for m in log] == [
        (role, text) for role, text in zip(["user", "assistant"] * 3, CONVERSATION, strict=True)
    ]
    # chat: never tried; auto: tried once, then known to be chat-only for the process.
    assert len(fake_upstream.responses_requests()) == (0 if mode == "chat" else 1)
    requests = chat_requests(fake_upstream)
    assert [r.json().get("stream", False) for r in requests] == [stream] * 3
    assert requests[0].json()["messages"][0]["content"].startswith("Answer briefly.")
    # Each turn's context: what memory holds, then the new question.
    assert chat_texts(fake_upstream)[-1][-1] == QUESTIONS[-1]


def test_a_function_tool_round_trips_as_function_call_items(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = sdk(make_gateway(upstream={"responses": "chat"}), api_key, session_id)
    question = register_content("weather in Paris?")
    first = client.responses.create(model="tool-caller", input=question, tools=[WEATHER_TOOL])
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.name, c.call_id) for c in calls] == [("get_weather", "call_1")]
    sent = chat_requests(fake_upstream)[-1].json()
    assert sent["tools"] == [
        {"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}
    ]
    output = {"type": "function_call_output", "call_id": "call_1", "output": "sunny in Paris"}
    second = client.responses.create(
        model="tool-caller", input=[output], tools=[WEATHER_TOOL], stream=True
    )
    completed = [e for e in second if e.type == "response.completed"]
    assert completed[0].response.output_text == "The tool said: sunny in Paris"
    log = stored_log(redis_server, api_key, session_id)
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "assistant"]
    assert log[1]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_a_built_in_tool_is_refused_naming_it(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    client = sdk(make_gateway(upstream={"responses": "chat"}), api_key, session_id)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="fake-model", input="hi", tools=[{"type": "web_search"}])
    assert raised.value.code == "unsupported_tool"
    assert raised.value.param == "tools.0.type"


def test_without_a_session_it_is_served_over_chat_without_memory(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str
) -> None:
    client = sdk(make_gateway(), api_key, None)  # auto, the default
    question = register_content("my favourite colour is teal")
    response = client.responses.with_raw_response.create(model="fake-model", input=question)
    assert response.headers["x-memory-status"] == "off"
    assert response.parse().output_text == "ack: my favourite colour is teal"
    streamed = list(client.responses.create(model="fake-model", input=question, stream=True))
    assert streamed[-1].type == "response.completed"
    assert chat_texts(fake_upstream) == [[question], [question]]


def test_native_passes_the_upstreams_404_as_before(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    client = sdk(make_gateway(upstream={"responses": "native"}), api_key, session_id)
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.create(model="fake-model", input=register_content("hi there"))
    assert raised.value.response.headers["x-memory-status"] == "not_recorded"
    assert chat_requests(fake_upstream) == []


@pytest.mark.parametrize("stream", [False, True])
async def test_the_agents_sdk_runs_three_turns_over_chat(
    async_openai: Any, redis_server: RedisProcess, api_key: str, session_id: str, stream: bool
) -> None:
    assistant = agent(async_openai)  # OpenAIResponsesModel, against the default (auto) gateway
    history: list[TResponseInputItem] = []
    for question in QUESTIONS:
        history.append({"role": "user", "content": register_content(question)})
        result = await run(assistant, history, stream)
        history = result.to_input_list()
    assert result.final_output == ANSWERS[-1]
    log = stored_log(redis_server, api_key, session_id)
    assert [(m["role"], content_text(m["content"])) for m in log] == [
        (role, text) for role, text in zip(["user", "assistant"] * 3, CONVERSATION, strict=True)
    ]


async def test_the_agents_sdk_calls_a_function_tool_over_chat(
    async_openai: Any, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    weather = agent(async_openai, "tool-caller", tools=[get_weather])
    history: list[TResponseInputItem] = [
        {"role": "user", "content": register_content("weather in Paris?")}
    ]
    result = await run(weather, history, stream=True)
    assert result.final_output == "The tool said: sunny in Paris"
    log = stored_log(redis_server, api_key, session_id)
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "assistant"]


@pytest.mark.parametrize("mode", ["generate", "stream", "ui"])
def test_the_vercel_default_provider_converses_over_chat(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    mode: str,
) -> None:
    # store: true, earlier answers resent as item_reference items naming the ids of the
    # output items the gateway made: memory resolves them, none goes upstream.
    said = vercel.converse(gateway, api_key, session_id, mode, vercel.QUESTIONS)
    assert said["references"] == 6, said["inputs"]
    assert said["answers"] == vercel.ANSWERS
    log = stored_log(redis_server, api_key, session_id)
    expected = [m for pair in zip(vercel.QUESTIONS, vercel.ANSWERS, strict=True) for m in pair]
    assert [(m["role"], content_text(m["content"])) for m in log] == [
        (role, text) for role, text in zip(["user", "assistant"] * 4, expected, strict=True)
    ]
    assert chat_texts(fake_upstream) == [expected[: 2 * turn + 1] for turn in range(4)]


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
    types = [event.type for event in events]
    assert "response.completed" not in types
    assert types[-1] == "error"
    assert events[-1].code == "memory_not_recorded"  # type: ignore[union-attr]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "ack: one two three four"  # the answer itself was relayed


def test_a_session_grown_past_a_small_model_is_answered_after_one_retry(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    # The chat upstream's overflow refusal is read as a chat one: planned again, once.
    gateway = make_gateway(memory={"preset": "hybrid-recall"}, upstream={"responses": "chat"})
    Memory(gateway, api_key, session_id).add(200, LONG)
    client = sdk(gateway, api_key, session_id)
    raw = client.responses.with_raw_response.create(model="small-openai", input="what comes next?")
    assert raw.headers["x-memory-status"] == "ok"
    assert raw.parse().output_text == "ack: what comes next?"
    sent = [r.json()["messages"] for r in chat_requests(fake_upstream)]
    assert len(sent) == 2  # refused as too long, then answered within a budget that fits
    assert prompt_tokens(sent[1]) <= SMALL_CONTEXT_TOKENS < prompt_tokens(sent[0])
    assert stored_log(redis_server, api_key, session_id)[-1]["content"] == "ack: what comes next?"
