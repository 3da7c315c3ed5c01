"""Model-aware budgets over real sockets (issue 23): a ``models:`` entry bounds what is
forwarded to a small model, and a session that outgrew its model (no entry, the default
3,000-token budget against a 2,048-token window) is answered all the same: the upstream's
refusal is met with one retry within a budget that fits, and the turn is recorded.

The fake's small models count a token every 3 characters (more than the gateway's count,
as another tokenizer may) and refuse a prompt over 2,048 as llama.cpp, OpenAI, or an older
llama.cpp without numbers would.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from devsupport.fake_upstream import SMALL_CONTEXT_TOKENS, FakeUpstream, prompt_tokens
from devsupport.servers import RedisProcess, ServerThread
from devsupport.stored import stored_log
from tests.support.clients import LONG, Memory, register_content
from tests.support.fixtures import GatewayFactory

# The configuration's defaults, not the tests' usual preset.
DEFAULTS = {"memory": {"preset": "hybrid-recall"}}


def _grown(gateway: ServerThread, key: str, session: str, messages: int = 200) -> Memory:
    memory = Memory(gateway, key, session)
    memory.add(messages, LONG)
    return memory


def _chat(
    gateway: ServerThread, key: str, session: str, model: str, text: str, **extra: Any
) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": register_content(text)}]}
    return httpx.post(
        gateway.url + "/v1/chat/completions",
        json={**body, **extra},
        headers={"Authorization": f"Bearer {key}", "X-Session-Id": session},
        timeout=30,
    )


def _turn_requests(fake: FakeUpstream, text: str) -> list[list[dict[str, Any]]]:
    """The messages of each upstream call made for the turn whose new message is ``text``."""
    calls = [request.json()["messages"] for request in fake.chat_requests()]
    return [messages for messages in calls if messages[-1].get("content") == text]


def _answer(response: httpx.Response, stream: bool) -> str:
    if not stream:
        return str(response.json()["choices"][0]["message"]["content"])
    data = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]", response.text
    return "".join(
        json.loads(event)["choices"][0]["delta"].get("content") or "" for event in data[:-1]
    )


def test_a_models_entry_bounds_the_budget_and_the_preview_agrees(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    entry = {"match": "fake-*", "context_tokens": 2048, "output_reserve_tokens": 512}
    gateway = make_gateway(**DEFAULTS, models=[entry])
    memory = _grown(gateway, api_key, session_id)

    answered = _chat(gateway, api_key, session_id, "fake-model", "what comes next, then?")
    assert answered.status_code == 200, answered.text
    assert answered.headers["x-memory-status"] == "ok"
    assert 1000 < int(answered.headers["x-memory-context-tokens"]) <= 2048 - 512
    assert answered.headers["x-memory-receipt"].endswith(";budget=1536")
    # The request's own max_tokens is the room kept for its answer.
    roomy = _chat(gateway, api_key, session_id, "fake-model", "and after?", max_tokens=1200)
    assert int(roomy.headers["x-memory-context-tokens"]) <= 2048 - 1200
    assert roomy.headers["x-memory-receipt"].endswith(";budget=848")
    # A model the entry does not match keeps memory.budget_tokens.
    other = _chat(gateway, api_key, session_id, "tool-caller", "and other models?")
    assert other.headers["x-memory-receipt"].endswith(";budget=3000")

    preview = memory.context("what comes next, then?")["receipt"]
    assert preview["budget_tokens"] == 1536
    assert preview["total_tokens"] <= 1536


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("model", ["small-llamacpp", "small-openai", "small-bare"])
def test_a_session_outgrowing_a_small_model_keeps_answering(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    model: str,
    stream: bool,
) -> None:
    gateway = make_gateway(**DEFAULTS)  # no models: entry; budget_tokens 3000
    _grown(gateway, api_key, session_id)
    before = len(stored_log(redis_server, api_key, session_id))

    texts = ["my code is tulip, remember it please", "what is my code?", "what is my code?"]
    replies = [f"ack: {texts[0]}", "Your code is tulip.", "Your code is tulip."]
    for turn, (text, reply) in enumerate(zip(texts, replies, strict=True)):
        fake_upstream.requests.clear()
        answered = _chat(gateway, api_key, session_id, model, text, stream=stream)
        assert answered.status_code == 200, answered.text
        assert answered.headers["x-memory-status"] == "ok"
        assert _answer(answered, stream) == reply
        calls = _turn_requests(fake_upstream, text)
        if turn == 0:
            # Refused once as too long, then answered within the window: never more.
            assert len(calls) == 2
            assert prompt_tokens(calls[0]) > SMALL_CONTEXT_TOKENS >= prompt_tokens(calls[1])
        else:
            # The budget that fitted is used at once for the model's next requests.
            assert len(calls) == 1
            assert prompt_tokens(calls[0]) <= SMALL_CONTEXT_TOKENS
        assert int(answered.headers["x-memory-context-tokens"]) < 3000
        stored = stored_log(redis_server, api_key, session_id)
        assert len(stored) == before + 2 * (turn + 1)  # the turn was recorded
        assert stored[-2]["content"] == text
        assert stored[-1]["content"] == reply


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_prompt_too_long_by_itself_is_retried_once_then_refused_as_the_upstream_said(
    make_gateway: GatewayFactory,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    stream: bool,
) -> None:
    gateway = make_gateway(**DEFAULTS)
    _grown(gateway, api_key, session_id, messages=40)
    before = len(stored_log(redis_server, api_key, session_id))
    text = "an endless question " * 400  # ~2,700 tokens by the small model's count alone

    refused = _chat(gateway, api_key, session_id, "small-llamacpp", text, stream=stream)
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "exceed_context_size_error"
    assert refused.headers["x-memory-status"] == "not_recorded"
    assert len(_turn_requests(fake_upstream, text)) == 2
    assert len(stored_log(redis_server, api_key, session_id)) == before


def test_no_other_error_is_retried(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(**DEFAULTS)
    _grown(gateway, api_key, session_id, messages=40)
    text = "does this one fail twice?"
    failed = _chat(gateway, api_key, session_id, "error-500", text)
    assert failed.status_code == 500
    assert len(_turn_requests(fake_upstream, text)) == 1
