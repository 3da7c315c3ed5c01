"""The background models' clients: the summarizer's chat model and the reranker's
embeddings, each one bounded JSON POST to an OpenAI-compatible endpoint.

They implement ``summarize.summarizer.ChatModel`` and ``service.ports.Embedder``; every
failure is one exception from ``gateway.errors``, on which memory falls back.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from gateway.errors import EmbeddingsUnavailable, SummarizerUnavailable
from gateway.upstream.client import client_session

# The most a background model's answer may hold: a summary is a few KB and a batch of
# embeddings a few MB; an endpoint that sends more is failing, and reading it whole would
# hold that much in the gateway's memory. (Its session asks for no compression and
# inflates none: a compressed answer is a malformed one.)
MAX_ANSWER_BYTES = 32 * 1024 * 1024


class _ModelClient:
    """One JSON POST to an OpenAI-compatible model endpoint, bounded, never retried.

    Its own session, with the same rules as ``Upstream`` (no cookies kept, no redirect
    followed, no retry): background model calls are never worth replaying a billed
    request. The whole call, body included, is bounded by ``timeout_s``; every failure is
    one exception (``error``), on which the caller falls back.
    """

    def __init__(
        self, *, url: str, api_key: str | None, timeout_s: float, error: type[Exception], what: str
    ) -> None:
        self.url = url
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.error = error
        self.what = what
        self._client: aiohttp.ClientSession | None = None

    @property
    def client(self) -> aiohttp.ClientSession:
        if self._client is None:
            self._client = client_session()
        return self._client

    async def post(self, body: dict[str, Any]) -> Any:
        headers = {"content-type": "application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode()
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self.client.post(
                    self.url, data=data, headers=headers, allow_redirects=False
                ) as response:
                    status = response.status
                    raw = await _read_bounded(response, MAX_ANSWER_BYTES)
        except TimeoutError:
            raise self.error(f"{self.what} sent no answer within {self.timeout_s:g} s") from None
        except (aiohttp.ClientError, OSError) as error:
            raise self.error(f"cannot reach the {self.what}: {type(error).__name__}") from None
        if raw is None:
            raise self.error(f"{self.what} sent an answer past {MAX_ANSWER_BYTES} bytes")
        if status != 200:
            raise self.error(f"{self.what} answered {status}")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nested too deeply to parse
            raise self.error(f"{self.what} sent a malformed body") from None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The body, or None once it passes ``limit`` bytes (the rest is not read)."""
    if response.content_length is not None and response.content_length > limit:
        return None
    parts: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


class UpstreamChatModel:
    """The summarizer's model: one non-streaming chat completion per call (a ``ChatModel``)."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        model: str,
        timeout_s: float,
        temperature: float,
    ) -> None:
        self.model = model
        self.temperature = temperature
        self._http = _ModelClient(
            url=base_url.rstrip("/") + "/chat/completions",
            api_key=api_key,
            timeout_s=timeout_s,
            error=SummarizerUnavailable,
            what="summarizer model",
        )

    async def complete(self, messages: list[dict[str, str]], *, max_tokens: int) -> str:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
        }
        data = await self._http.post(body)
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise SummarizerUnavailable("summarizer model sent a malformed body") from None
        if not isinstance(content, str):
            raise SummarizerUnavailable("summarizer model sent no text content")
        return content

    async def aclose(self) -> None:
        await self._http.aclose()


class UpstreamEmbeddings:
    """Vectors for recall's reranking, from an OpenAI-compatible ``/embeddings``."""

    def __init__(self, *, base_url: str, api_key: str | None, model: str, timeout_s: float) -> None:
        self.model = model
        self._http = _ModelClient(
            url=base_url.rstrip("/") + "/embeddings",
            api_key=api_key,
            timeout_s=timeout_s,
            error=EmbeddingsUnavailable,
            what="embeddings model",
        )

    async def embed(self, texts: list[str]) -> list[list[float]]:
        data = await self._http.post({"model": self.model, "input": texts})
        try:
            rows = sorted(data["data"], key=lambda row: row["index"])
            vectors = [[float(x) for x in row["embedding"]] for row in rows]
        except (KeyError, TypeError, ValueError):
            raise EmbeddingsUnavailable("embeddings model sent a malformed body") from None
        if len(vectors) != len(texts):
            raise EmbeddingsUnavailable("embeddings model sent a wrong number of vectors")
        return vectors

    async def aclose(self) -> None:
        await self._http.aclose()
