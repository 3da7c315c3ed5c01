"""The upstream client: the only module that imports httpx.

Policy here, IO in the transport: tests inject ``httpx.MockTransport`` or talk to a real
fake server. Choices, each for a reason:

* one shared ``AsyncClient`` (connection reuse), whose cookie jar refuses every cookie:
  httpx would otherwise store an upstream's ``Set-Cookie`` and replay it for every other
  client of the gateway;
* redirects are never followed and nothing is retried (httpx does not retry a sent
  request; ``retries=0`` on the transport keeps even connects single-shot): a POST that
  reached the upstream may have been billed and acted upon;
* time to first byte and idle time between chunks are enforced by the gateway, not by
  httpx's single read timeout, so each has its own limit and its own error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from gateway.config import UpstreamConfig
from gateway.errors import UpstreamTimeout, UpstreamUnreachable
from gateway.memory.recall import EmbeddingsUnavailable
from gateway.memory.summarizer import SummarizerUnavailable


class UpstreamStreamBroken(Exception):
    """The upstream body stopped after it had begun (stall past the idle limit, or reset)."""

    def __init__(self, message: str, *, timeout: bool) -> None:
        super().__init__(message)
        self.timeout = timeout


class _NoCookies(DefaultCookiePolicy):
    """A cookie policy that neither keeps nor sends any cookie."""

    def set_ok(self, cookie: Any, request: Any) -> bool:
        return False

    def return_ok(self, cookie: Any, request: Any) -> bool:
        return False


@dataclass
class UpstreamResponse:
    """An upstream answer whose headers have arrived and whose body is still to read."""

    status_code: int
    headers: list[tuple[str, str]]
    _response: httpx.Response
    _idle_s: float

    async def iter_body(self, *, decoded: bool) -> AsyncIterator[bytes]:
        """The body as it arrives; ``decoded`` undoes content-encoding (to read it)."""
        chunks = self._response.aiter_bytes() if decoded else self._response.aiter_raw()
        iterator = chunks.__aiter__()
        while True:
            try:
                async with asyncio.timeout(self._idle_s):
                    chunk = await iterator.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise UpstreamStreamBroken(
                    f"upstream sent nothing for {self._idle_s:g} s", timeout=True
                ) from None
            except httpx.HTTPError as error:
                raise UpstreamStreamBroken(
                    f"upstream stream broke: {type(error).__name__}", timeout=False
                ) from None
            if chunk:
                yield chunk

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_body(decoded=True)])

    async def aclose(self) -> None:
        await self._response.aclose()


class Upstream:
    """Sends requests to the configured OpenAI-compatible base URL."""

    def __init__(
        self, config: UpstreamConfig, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.config = config
        self.base_url = config.base_url.rstrip("/")
        timeouts = config.timeouts
        self.client = httpx.AsyncClient(
            transport=transport
            or httpx.AsyncHTTPTransport(
                retries=0,
                limits=httpx.Limits(
                    max_connections=config.max_connections,
                    max_keepalive_connections=config.max_keepalive_connections,
                ),
            ),
            timeout=httpx.Timeout(
                connect=timeouts.connect_s,
                read=None,
                write=timeouts.write_s,
                pool=timeouts.connect_s,
            ),
            follow_redirects=False,
            # The jar itself, not httpx.Cookies(jar): the client copies a Cookies object into a
            # fresh default jar, which would drop the refusing policy.
            cookies=CookieJar(policy=_NoCookies()),
        )
        # httpx adds its own Accept, Accept-Encoding and User-Agent to every request; a
        # transparent proxy sends the client's headers only.
        for name in ("accept", "accept-encoding", "user-agent"):
            del self.client.headers[name]

    def url(self, path: str) -> str:
        """``/v1/models`` → ``{base_url}/models``: the base URL already names the version."""
        suffix = path[3:] if path.startswith("/v1/") or path == "/v1" else path
        return self.base_url + suffix

    async def open(
        self,
        method: str,
        path: str,
        *,
        query: bytes = b"",
        headers: Iterable[tuple[str, str]],
        content: bytes | AsyncIterator[bytes],
    ) -> UpstreamResponse:
        """Send the request and wait for the response headers (time to first byte)."""
        # The raw query, not re-encoded; none at all (not a bare "?") when it is empty.
        url = httpx.URL(self.url(path), query=query) if query else httpx.URL(self.url(path))
        request = self.client.build_request(
            method,
            url,
            # As bytes: a header the client sent with non-ASCII bytes (which the ASGI
            # server decoded as latin-1) would make httpx's ASCII encoding fail, a 500.
            headers=[(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers],
            content=content,
        )
        first_byte_s = self.config.timeouts.first_byte_s
        try:
            async with asyncio.timeout(first_byte_s):
                response = await self.client.send(request, stream=True)
        except TimeoutError:
            raise UpstreamTimeout(f"upstream sent no response within {first_byte_s:g} s") from None
        except httpx.ConnectTimeout:
            raise UpstreamTimeout("timed out connecting to the upstream") from None
        except httpx.PoolTimeout:
            raise UpstreamUnreachable("no upstream connection became free in time") from None
        except httpx.HTTPError as error:
            raise UpstreamUnreachable(
                f"cannot reach the upstream: {type(error).__name__}"
            ) from None
        return UpstreamResponse(
            status_code=response.status_code,
            headers=list(response.headers.multi_items()),
            _response=response,
            _idle_s=self.config.timeouts.idle_s,
        )

    async def aclose(self) -> None:
        await self.client.aclose()


class _ModelClient:
    """One JSON POST to an OpenAI-compatible model endpoint, bounded, never retried.

    Its own client, with the same rules as ``Upstream`` (no cookies kept, no redirect
    followed, no retry): background model calls are never worth replaying a billed
    request. The whole call, body included, is bounded by ``timeout_s``; every failure is
    one exception (``error``), on which the caller falls back.
    """

    def __init__(
        self,
        *,
        url: str,
        api_key: str | None,
        timeout_s: float,
        error: type[Exception],
        what: str,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.error = error
        self.what = what
        self.client = httpx.AsyncClient(
            transport=transport or httpx.AsyncHTTPTransport(retries=0),
            # httpx's own limits (5 s by default) would cut a slow model short of timeout_s.
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=False,
            cookies=CookieJar(policy=_NoCookies()),
        )

    async def post(self, body: dict[str, Any]) -> Any:
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self.client.post(self.url, json=body, headers=headers)
        except TimeoutError:
            raise self.error(f"{self.what} sent no answer within {self.timeout_s:g} s") from None
        except httpx.HTTPError as error:
            raise self.error(f"cannot reach the {self.what}: {type(error).__name__}") from None
        if response.status_code != 200:
            raise self.error(f"{self.what} answered {response.status_code}")
        try:
            return response.json()
        except ValueError:
            raise self.error(f"{self.what} sent a malformed body") from None

    async def aclose(self) -> None:
        await self.client.aclose()


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
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.model = model
        self.temperature = temperature
        self._http = _ModelClient(
            url=base_url.rstrip("/") + "/chat/completions",
            api_key=api_key,
            timeout_s=timeout_s,
            error=SummarizerUnavailable,
            what="summarizer model",
            transport=transport,
        )
        self.client = self._http.client  # tests inspect the client's settings

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

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        model: str,
        timeout_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.model = model
        self._http = _ModelClient(
            url=base_url.rstrip("/") + "/embeddings",
            api_key=api_key,
            timeout_s=timeout_s,
            error=EmbeddingsUnavailable,
            what="embeddings model",
            transport=transport,
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
