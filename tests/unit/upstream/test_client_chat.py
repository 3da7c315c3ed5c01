"""The summarizer's and embeddings' model clients, against a local upstream on a real socket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from gateway.errors import EmbeddingsUnavailable, SummarizerUnavailable
from gateway.upstream import models
from gateway.upstream.models import UpstreamChatModel, UpstreamEmbeddings
from tests.support.local_upstream import RESET, LocalUpstream, Script, local_upstream

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


def answer(
    make: Callable[[], web.Response],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A handler answering each request with a fresh ``make()`` (a response is sent once)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return make()

    return handler


@pytest.fixture
async def server() -> AsyncIterator[LocalUpstream]:
    async with local_upstream(answer(lambda: web.json_response(completion()))) as running:
        yield running


def model(server: LocalUpstream, **overrides: Any) -> UpstreamChatModel:
    options: dict[str, Any] = {
        "base_url": server.base_url + "/",
        "api_key": "sk-summarizer",
        "model": "gpt-4o-mini",
        "timeout_s": 2.0,
        "temperature": 0.2,
    }
    options.update(overrides)
    return UpstreamChatModel(**options)


async def test_posts_a_non_streaming_completion(server: LocalUpstream) -> None:
    client = model(server)
    try:
        text = await client.complete(MESSAGES, max_tokens=400)
    finally:
        await client.aclose()
    assert text == "The user's seat is 14C."
    (request,) = server.seen
    assert request.method == "POST"
    assert request.target == "/v1/chat/completions"
    assert request.header_values("authorization") == [b"Bearer sk-summarizer"]
    assert request.header_values("content-type") == [b"application/json"]
    assert json.loads(request.body) == {
        "model": "gpt-4o-mini",
        "messages": MESSAGES,
        "max_tokens": 400,
        "temperature": 0.2,
    }


async def test_sends_no_authorization_without_a_key(server: LocalUpstream) -> None:
    client = model(server, api_key=None)
    try:
        await client.complete(MESSAGES, max_tokens=10)
    finally:
        await client.aclose()
    assert server.seen[0].header_values("authorization") == []


async def test_keeps_no_cookie_between_calls(server: LocalUpstream) -> None:
    server.handler = answer(
        lambda: web.json_response(completion(), headers={"set-cookie": "sid=abc; Path=/"})
    )
    client = model(server)
    try:
        await client.complete(MESSAGES, max_tokens=10)
        await client.complete(MESSAGES, max_tokens=10)
    finally:
        await client.aclose()
    assert server.seen[1].header_values("cookie") == []


BAD_ANSWERS = {
    "500": lambda: web.json_response({"error": {"message": "exploded"}}, status=500),
    "429": lambda: web.json_response({"error": {"message": "slow down"}}, status=429),
    "redirect": lambda: web.Response(status=302, headers={"location": "/v1/chat/completions"}),
    "not-json": lambda: web.Response(body=b"not json"),
    # Past Python's recursion limit: json.loads raises RecursionError, not ValueError.
    "nested-too-deep": lambda: web.Response(body=b"[" * 100_000),
    "no-choices": lambda: web.json_response({"choices": []}),
    "no-content": lambda: web.json_response({"choices": [{"message": {}}]}),
    "null-content": lambda: web.json_response({"choices": [{"message": {"content": None}}]}),
    "list-body": lambda: web.json_response(["not", "an", "object"]),
    "list-content": lambda: web.json_response(completion(content=["a", "list"])),
}


@pytest.mark.parametrize("bad", sorted(BAD_ANSWERS))
async def test_a_bad_answer_is_unavailable(server: LocalUpstream, bad: str) -> None:
    server.handler = answer(BAD_ANSWERS[bad])
    client = model(server)
    try:
        with pytest.raises(SummarizerUnavailable):
            await client.complete(MESSAGES, max_tokens=10)
    finally:
        await client.aclose()
    assert len(server.seen) == 1  # no retry, no redirect followed


async def test_a_slow_model_is_unavailable_after_the_timeout(server: LocalUpstream) -> None:
    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.json_response(completion())

    server.handler = slow
    client = model(server, timeout_s=0.1)
    started = asyncio.get_running_loop().time()
    try:
        with pytest.raises(SummarizerUnavailable, match=r"within 0\.1 s"):
            await client.complete(MESSAGES, max_tokens=10)
    finally:
        await client.aclose()
    assert asyncio.get_running_loop().time() - started < 2


async def test_a_body_that_stops_short_is_bounded_too(server: LocalUpstream) -> None:
    """The timeout covers the body, not only the headers."""
    server.handler = Script(b'{"choices": [', 5.0)
    client = model(server, timeout_s=0.1)
    try:
        with pytest.raises(SummarizerUnavailable, match=r"within 0\.1 s"):
            await client.complete(MESSAGES, max_tokens=10)
    finally:
        await client.aclose()


async def test_a_refused_connection_is_unavailable() -> None:
    async with local_upstream() as gone:
        base_url = gone.base_url
    client = UpstreamChatModel(
        base_url=base_url, api_key=None, model="m", timeout_s=2, temperature=0
    )
    try:
        with pytest.raises(SummarizerUnavailable, match="ClientConnectorError"):
            await client.complete(MESSAGES, max_tokens=10)
    finally:
        await client.aclose()


async def test_a_reset_mid_body_is_unavailable(server: LocalUpstream) -> None:
    server.handler = Script(b'{"choices": [', 0.05, RESET)
    client = model(server)
    try:
        with pytest.raises(SummarizerUnavailable, match="ClientPayloadError"):
            await client.complete(MESSAGES, max_tokens=10)
    finally:
        await client.aclose()


async def test_embeddings_client_orders_vectors_and_reports_failures(
    server: LocalUpstream,
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        body = json.loads(server.seen[-1].body)
        if body["input"] == ["bad"]:
            return web.json_response({"data": [{"index": 0}]})
        if body["input"] == ["down"]:
            return web.json_response({}, status=503)
        rows = [{"index": i, "embedding": [float(i), 1.0]} for i in range(len(body["input"]))]
        return web.json_response({"data": list(reversed(rows))})

    server.handler = handler
    client = UpstreamEmbeddings(base_url=server.base_url, api_key=None, model="m", timeout_s=1)
    try:
        assert await client.embed(["a", "b"]) == [[0.0, 1.0], [1.0, 1.0]]
        for text in ("bad", "down"):
            with pytest.raises(EmbeddingsUnavailable):
                await client.embed([text])
    finally:
        await client.aclose()
    assert server.seen[0].target == "/v1/embeddings"


@pytest.mark.parametrize("declared", [True, False])
async def test_an_answer_past_the_bound_is_a_failure_not_held(
    monkeypatch: pytest.MonkeyPatch, declared: bool
) -> None:
    # 64 KiB of JSON against a bound of 16 KiB, with a Content-Length or chunked: the
    # client stops reading at the bound and falls back.
    monkeypatch.setattr(models, "MAX_ANSWER_BYTES", 16 * 1024)
    big = completion("x" * 64 * 1024)

    def make() -> web.StreamResponse:
        response = web.json_response(big)
        if not declared:
            response.enable_chunked_encoding()
        return response

    async with local_upstream(answer(make)) as running:
        client = model(running)
        try:
            with pytest.raises(SummarizerUnavailable, match="past 16384 bytes"):
                await client.complete(MESSAGES, max_tokens=400)
        finally:
            await client.aclose()
    monkeypatch.setattr(models, "MAX_ANSWER_BYTES", 1 << 20)
    async with local_upstream(answer(make)) as running:  # under the bound: read whole
        client = model(running)
        try:
            assert await client.complete(MESSAGES, max_tokens=400) == "x" * 64 * 1024
        finally:
            await client.aclose()
