"""LangChain's ``ChatOpenAI`` through the gateway (issue 34): an app keeps its history as
a list of HumanMessage/AIMessage and resends it every turn, earlier answers as the
AIMessages the model returned. With ``use_responses_api=True`` it speaks ``/v1/responses``
(earlier answers resent as ``output_text`` message items without their ids), against an
upstream with the Responses API and one with chat completions only; without it, chat
completions.
Each turn must store its own two messages once and send upstream each message once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk, BaseMessage, HumanMessage
from langchain_openai import ChatOpenAI

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess, ServerThread
from devsupport.stored import stored_log
from gateway.memory.model import content_text
from tests.integration.test_agents_sdk import ANSWERS, QUESTIONS
from tests.support.clients import register_content

CONVERSATION = [m for pair in zip(QUESTIONS, ANSWERS, strict=True) for m in pair]
# Against the suite's upstream, with the Responses API, and one that serves chat only.
UPSTREAMS = pytest.mark.parametrize(
    "fake_upstream_server", [False, True], ids=["native", "chat-only"], indirect=True
)


@pytest.fixture(scope="module")
def fake_upstream_server(request: pytest.FixtureRequest) -> Iterator[tuple[FakeUpstream, Any]]:
    """The suite's upstream, or (``chat_only`` param) one without the Responses API, as
    llama-cpp-python, Ollama and many vLLM deployments are (overrides the suite's)."""
    fake = FakeUpstream(chat_only=getattr(request, "param", False))
    with ServerThread(fake.app()) as thread:
        yield fake, thread


def chat_model(
    gateway: ServerThread, key: str, session: str, responses: bool, **fields: Any
) -> ChatOpenAI:
    return ChatOpenAI(
        model="fake-model",
        base_url=gateway.url + "/v1",
        api_key=key,  # type: ignore[arg-type]
        default_headers={"X-Session-Id": session},
        use_responses_api=responses,
        max_retries=0,
        timeout=10,
        **fields,
    )


def converse(model: ChatOpenAI, stream: bool) -> list[BaseMessage]:
    """Three turns, each resending the whole history, as a LangChain app does."""
    history: list[BaseMessage] = []
    for question in QUESTIONS:
        history.append(HumanMessage(register_content(question)))
        if not stream:
            answer: BaseMessage = model.invoke(history)
        else:
            # The chunks added up: an AIMessageChunk, which is an AIMessage.
            answer = sum(model.stream(history), AIMessageChunk(content=""))
        history.append(answer)
    return history


def message_texts(messages: list[dict[str, Any]]) -> list[str]:
    """User and assistant texts (not the memory block's or instructions' system ones)."""
    return [content_text(m["content"]) for m in messages if m["role"] in ("user", "assistant")]


def forwarded_texts(fake: FakeUpstream) -> list[list[str]]:
    """Each request forwarded for the client (on either API): its messages' texts."""
    turns = []
    for request in fake.proxied_requests():
        body = request.json()
        if request.path == "/v1/chat/completions":
            turns.append(message_texts(body["messages"]))
        elif request.path == "/v1/responses" and not fake.chat_only:
            items = body["input"]
            turns.append(message_texts([i for i in items if i.get("type") == "message"]))
    return turns


def assert_stored_once(
    fake: FakeUpstream, redis_server: RedisProcess, key: str, session: str
) -> None:
    log = stored_log(redis_server, key, session)
    assert [(m["role"], content_text(m["content"])) for m in log] == [
        (role, text) for role, text in zip(["user", "assistant"] * 3, CONVERSATION, strict=True)
    ]
    # Each turn sent each earlier message once, then the new question.
    assert forwarded_texts(fake) == [CONVERSATION[: 2 * n + 1] for n in range(3)]


@UPSTREAMS
@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
def test_responses_api_conversation_is_stored_once(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    stream: bool,
) -> None:
    model = chat_model(gateway, api_key, session_id, responses=True)
    history = converse(model, stream)
    assert [m.text for m in history[1::2]] == ANSWERS  # the fake answers from what it was sent
    assert [str(m.id)[:5] for m in history[1::2]] == ["resp_"] * 3, history
    assert_stored_once(fake_upstream, redis_server, api_key, session_id)
    # auto (the default): a chat-only upstream is tried once, then known for the process.
    assert len(fake_upstream.responses_requests()) == (1 if fake_upstream.chat_only else 3)


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
def test_chat_completions_conversation_is_stored_once(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
    stream: bool,
) -> None:
    model = chat_model(gateway, api_key, session_id, responses=False)
    history = converse(model, stream)
    assert [m.text for m in history[1::2]] == ANSWERS
    assert_stored_once(fake_upstream, redis_server, api_key, session_id)


@UPSTREAMS
def test_previous_response_id_is_answered_from_memory(
    gateway: ServerThread,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    # LangChain's other mode: only the messages after its last AIMessage, and that
    # message's response id as previous_response_id. The gateway answers it from memory
    # (on either upstream: what goes upstream is the remembered history, no id).
    model = chat_model(gateway, api_key, session_id, responses=True, use_previous_response_id=True)
    history = converse(model, stream=True)
    assert [m.text for m in history[1::2]] == ANSWERS
    assert_stored_once(fake_upstream, redis_server, api_key, session_id)
    sent = [r.json() for r in fake_upstream.proxied_requests()]
    assert all("previous_response_id" not in body for body in sent)
