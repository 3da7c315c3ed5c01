"""The summarizer's model client, against httpx.MockTransport (no sockets)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from gateway.memory.recall import EmbeddingsUnavailable
from gateway.memory.summarizer import SummarizerUnavailable
from gateway.proxy.upstream import UpstreamChatModel, UpstreamEmbeddings

Handler = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]
MESSAGES = [
    {"role": "system", "content": "[memory-gateway:chunk]\nSummarize."},
    {"role": "user", "content": "Message 1 (User): my seat is 14C"},
]


def completion(content: Any = "The user's seat is 14C.") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
    }


class Recorder:
    """A MockTransport handler that records requests and answers with one response."""

    def __init__(self, response: httpx.Response | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self.response = response or httpx.Response(200, json=completion())

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.response


def model(handler: Handler, **overrides: Any) -> UpstreamChatModel:
    options: dict[str, Any] = {
        "base_url": "http://summarizer.test/v1/",
        "api_key": "sk-summarizer",
        "model": "gpt-4o-mini",
        "timeout_s": 2.0,
        "temperature": 0.2,
    }
    options.update(overrides)
    return UpstreamChatModel(**options, transport=httpx.MockTransport(handler))


async def test_posts_a_non_streaming_completion() -> None:
    recorder = Recorder()
    client = model(recorder)
    try:
        text = await client.complete(MESSAGES, max_tokens=400)
    finally:
        await client.aclose()
    assert text == "The user's seat is 14C."
    (request,) = recorder.requests
    assert request.method == "POST"
    assert str(request.url) == "http://summarizer.test/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-summarizer"
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.content) == {
        "model": "gpt-4o-mini",
        "messages": MESSAGES,
        "max_tokens": 400,
        "temperature": 0.2,
    }


async def test_sends_no_authorization_without_a_key() -> None:
    recorder = Recorder()
    client = model(recorder, api_key=None)
    try:
        await client.complete(MESSAGES, max_tokens=10)
    finally:
        await client.aclose()
    assert "authorization" not in recorder.requests[0].headers


async def test_keeps_no_cookie_between_calls() -> None:
    response = httpx.Response(200, json=completion(), headers={"set-cookie": "sid=abc; Path=/"})
    recorder = Recorder(response)
    client = model(recorder)
    try:
        await client.complete(MESSAGES, max_tokens=10)
        await client.complete(MESSAGES, max_tokens=10)
    finally:
        await client.aclose()
    assert "cookie" not in recorder.requests[1].headers


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(500, json={"error": {"message": "exploded"}}),
        httpx.Response(429, json={"error": {"message": "slow down"}}),
        httpx.Response(302, headers={"location": "http://elsewhere.test/v1/chat/completions"}),
        httpx.Response(200, content=b"not json"),
        httpx.Response(200, json={"choices": []}),
        httpx.Response(200, json={"choices": [{"message": {}}]}),
        httpx.Response(200, json={"choices": [{"message": {"content": None}}]}),
        httpx.Response(200, json=["not", "an", "object"]),
        httpx.Response(200, json=completion(content=["a", "list"])),
    ],
    ids=[
        "500",
        "429",
        "redirect",
        "not-json",
        "no-choices",
        "no-content",
        "null-content",
        "list-body",
        "list-content",
    ],
)
async def test_a_bad_answer_is_unavailable(response: httpx.Response) -> None:
    recorder = Recorder(response)
    client = model(recorder)
    try:
        with pytest.raises(SummarizerUnavailable):
            await client.complete(MESSAGES, max_tokens=10)
    finally:
        await client.aclose()
    assert len(recorder.requests) == 1  # no retry, no redirect followed


async def test_a_slow_model_is_unavailable_after_the_timeout() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200, json=completion())

    client = model(slow, timeout_s=0.1)
    started = asyncio.get_running_loop().time()
    try:
        with pytest.raises(SummarizerUnavailable, match=r"within 0\.1 s"):
            await client.complete(MESSAGES, max_tokens=10)
    finally:
        await client.aclose()
    assert asyncio.get_running_loop().time() - started < 2


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectError("connection refused"),
        httpx.ConnectTimeout("connect timed out"),
        httpx.ReadTimeout("read timed out"),
        httpx.RemoteProtocolError("peer closed connection"),
    ],
)
async def test_a_transport_error_is_unavailable(error: httpx.HTTPError) -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise error

    client = model(fail)
    try:
        with pytest.raises(SummarizerUnavailable, match=type(error).__name__):
            await client.complete(MESSAGES, max_tokens=10)
    finally:
        await client.aclose()


async def test_embeddings_client_orders_vectors_and_reports_failures() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body["input"] == ["bad"]:
            return httpx.Response(200, json={"data": [{"index": 0}]})
        if body["input"] == ["down"]:
            return httpx.Response(503, json={})
        rows = [{"index": i, "embedding": [float(i), 1.0]} for i in range(len(body["input"]))]
        return httpx.Response(200, json={"data": list(reversed(rows))})

    client = UpstreamEmbeddings(
        base_url="http://model.test/v1", api_key=None, model="m", timeout_s=1,
        transport=httpx.MockTransport(handler),
    )  # fmt: skip
    assert await client.embed(["a", "b"]) == [[0.0, 1.0], [1.0, 1.0]]
    for text in ("bad", "down"):
        with pytest.raises(EmbeddingsUnavailable):
            await client.embed([text])
    await client.aclose()
