"""Issue 34 against a real model: the README's local Quick start, run as written, and the
clients that speak the Responses API (the Agents SDK, LangChain's ``use_responses_api``,
the Vercel AI SDK's default provider), each for a short conversation with its history
resent, through the gateway to llama.cpp's server (SmolLM2), which has chat completions
only: the gateway serves ``/v1/responses`` over them. Each stored log must be exactly the
conversation the client had.

Greedy decoding (``temperature`` 0) makes the model's answers repeatable; what it says
is its own business, except where the Quick start promises a remembered answer.
Deselected unless ``-m local_model`` (``scripts/test-local-model``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI, OpenAI

from devsupport.servers import RedisProcess, ServerThread, free_port
from devsupport.stored import stored_log
from gateway.memory.model import content_text
from tests.integration.test_vercel_ai import converse
from tests.support.fixtures import GatewayFactory
from tests.support.local_model import serving

pytestmark = pytest.mark.local_model

README = Path(__file__).resolve().parents[2] / "README.md"
QUESTIONS = ["My seat is 14C.", "Which seat did I say?"]
# Short answers: the model is slow, and what is checked is where they are stored.
MAX_TOKENS = 40
# A real model on a loaded 2-core machine: seconds to its first token.
ROOMY = {"upstream": {"timeouts": {"first_byte_s": 120, "idle_s": 60}}}
LOCAL = {
    **ROOMY,
    "summarizer": {"model": None},  # the one-slot server answers turns, not summaries
    "models": [{"match": "*", "context_tokens": 2048}],
}


def readme_local_config(base_url: str) -> str:
    """The README's ``local.yaml``, as written there, pointed at this test's server."""
    found = re.search(r"cat > local\.yaml <<'YAML'\n(.*?)\nYAML\n", README.read_text(), re.S)
    assert found, "the README's local set-up (cat > local.yaml <<'YAML' … YAML) is gone"
    written = "http://127.0.0.1:8000/v1"
    assert written in found[1]
    return found[1].replace(written, base_url)


@pytest.fixture
def quick_start(tmp_path: Path, smollm2: str) -> Iterator[str]:
    """``memory-gateway serve --config local.yaml``, the README's, on a free port."""
    config = tmp_path / "local.yaml"
    config.write_text(readme_local_config(smollm2))
    port = free_port()
    command = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config),
               "--port", str(port)]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    # Its embedded Redis keeps its files in its working directory: the test's own.
    log = tmp_path / "gateway.log"
    with serving(command, url + "/healthz", log, seconds=60, cwd=tmp_path):
        yield url


def test_the_readme_quick_start_remembers_the_seat_through_both_apis(quick_start: str) -> None:
    client = OpenAI(
        base_url=quick_start + "/v1",
        api_key="sk-local-dev-key",
        default_headers={"X-Session-Id": "conversation-42"},
        timeout=300,
    )
    for question in QUESTIONS:  # each request only the new message, as the README does
        chat = client.chat.completions.create(
            model="gpt-4o-mini", temperature=0, max_tokens=MAX_TOKENS,
            messages=[{"role": "user", "content": question}],
        )  # fmt: skip
    assert "14C" in (chat.choices[0].message.content or "")
    answer = client.responses.create(
        model="gpt-4o-mini", temperature=0, max_output_tokens=MAX_TOKENS, input=QUESTIONS[1]
    )
    assert "14C" in answer.output_text


@pytest.fixture(scope="module")
def upstream_url(smollm2: str) -> str:
    """The gateways of this module forward to the real model (overrides the suite's)."""
    return smollm2


def stored_texts(redis_server: RedisProcess, key: str, session: str) -> list[str]:
    return [content_text(m["content"]) for m in stored_log(redis_server, key, session)]


async def test_the_agents_sdk_resending_its_input_list(
    make_gateway: GatewayFactory, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(**LOCAL)
    client = AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key=api_key, timeout=300,
        default_headers={"X-Session-Id": session_id},
    )  # fmt: skip
    assistant: Agent[Any] = Agent(
        name="assistant",
        instructions="Answer briefly.",
        model=OpenAIResponsesModel("smollm2", client),
        model_settings=ModelSettings(temperature=0, max_tokens=MAX_TOKENS),
    )
    history: list[Any] = []
    said: list[str] = []
    async with client:
        for question in QUESTIONS:
            history.append({"role": "user", "content": question})
            run = RunConfig(tracing_disabled=True)
            result = await Runner.run(assistant, history, run_config=run)
            history = result.to_input_list()
            said += [question, result.final_output]
    assert stored_texts(redis_server, api_key, session_id) == said


@pytest.mark.parametrize("stream", [False, True])
def test_langchain_on_the_responses_api_resending_its_history(
    make_gateway: GatewayFactory,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    stream: bool,
) -> None:
    gateway = make_gateway(**LOCAL)
    model = ChatOpenAI(
        model="smollm2",
        base_url=gateway.url + "/v1",
        api_key=api_key,  # type: ignore[arg-type]
        default_headers={"X-Session-Id": session_id},
        use_responses_api=True,
        temperature=0,
        max_tokens=MAX_TOKENS,  # type: ignore[call-arg]
        timeout=300,
    )
    history: list[BaseMessage] = []
    said: list[str] = []
    for question in QUESTIONS:
        history.append(HumanMessage(question))
        if stream:
            chunks = list(model.stream(history))
            answer: BaseMessage = chunks[0]
            for chunk in chunks[1:]:
                answer = answer + chunk  # type: ignore[operator]
        else:
            answer = model.invoke(history)
        history.append(answer)
        said += [question, answer.text]
    assert stored_texts(redis_server, api_key, session_id) == said


@pytest.mark.parametrize("mode", ["generate", "ui"])
def test_the_vercel_ai_sdk_default_provider_resending_its_history(
    make_gateway: GatewayFactory,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    mode: str,
) -> None:
    gateway: ServerThread = make_gateway(**LOCAL)
    said = converse(
        gateway, api_key, session_id, mode, QUESTIONS, ["smollm2"] * len(QUESTIONS),
        timeout_s=600, maxOutputTokens=MAX_TOKENS, temperature=0,
    )  # fmt: skip
    assert said["references"] == 1  # the first answer, resent by reference
    conversation = [m for pair in zip(QUESTIONS, said["answers"], strict=True) for m in pair]
    assert stored_texts(redis_server, api_key, session_id) == conversation
