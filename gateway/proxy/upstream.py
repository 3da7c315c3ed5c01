"""The upstream client: the only module that imports an HTTP client library (aiohttp).

Why aiohttp and not httpx: with hundreds of concurrent streams httpx 0.28's pool spends
time proportional to its connection count on every request and release, under a lock
(httpx issue #3215). Measured by ``bench/upstream_client.py`` on 2 cores: 256 concurrent
0.7 s streams, httpx ~60-120 req/s with multi-second p99 (still ~310 req/s only when
sharded over 64 clients), aiohttp ~330 req/s (the ideal is 366); at 1024 streams httpx
timed out hundreds of requests where aiohttp carried ~1,000 req/s; and aiohttp adds
about a third less latency per request.

Choices, each for a reason:

* one shared ``ClientSession`` (connection reuse), made on first use (aiohttp wants a
  running loop), whose ``DummyCookieJar`` neither keeps nor sends cookies: a kept
  ``Set-Cookie`` would be replayed for every other client of the gateway;
* redirects are never followed and nothing is retried: a POST that reached the upstream
  may have been billed and acted upon. aiohttp resends an idempotent request once when a
  kept-alive connection turns out closed; that is switched off (``_retry_connection``);
* only the client's headers go upstream: aiohttp's own Accept, Accept-Encoding,
  User-Agent and Content-Type are skipped, and bodies arrive raw (``auto_decompress``
  off) so a passthrough relays them byte for byte; ``decoded`` undoes gzip/deflate here;
* connect, time to first byte, silence between chunks and each body write have their
  own limits and their own errors, enforced here rather than by one client-wide timeout;
* the wait for a pooled connection when all are busy has its own short deadline
  (``pool_s``), then a 503: a pool held by streams nobody reads must not make every
  other request wait out the connect timeout;
* an answer's size is bounded (``max_response_bytes``), counted after decoding: a
  compressed body is inflated in bounded pieces, so a gzip bomb stops at the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import zlib
from collections.abc import AsyncIterator, Iterable, Iterator
from functools import lru_cache
from typing import Any
from urllib.parse import quote_from_bytes

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from yarl import URL

from gateway import offload
from gateway.config import UpstreamConfig
from gateway.errors import InvalidRequest, UpstreamPoolFull, UpstreamTimeout, UpstreamUnreachable
from gateway.memory.rerank import EmbeddingsUnavailable
from gateway.memory.summarizer import SummarizerUnavailable

# aiohttp adds these unless told not to; a transparent proxy sends the client's only.
_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
# aiohttp's writer waits for the transport to drain only past this many bytes written
# since the last drain (its write's LIMIT); below it a write returns without waiting.
_UNDRAINED = 0x10000
# Bytes a query may carry as they are; anything else (non-ASCII) is percent-encoded.
_QUERY_SAFE = bytes(range(0x21, 0x7F))
# Decoded bytes made at most per step: a compressed chunk of a few KB may inflate a
# thousandfold (a gzip bomb), so it is inflated in pieces, each counted before the next.
_DECODED_PIECE = 1 << 16
# Bytes relayed before the other requests get their turn on the loop (see iter_body).
_UNBROKEN_BYTES = 1 << 16


# Parsed once per URL: the chat path is every request's (yarl's parse is ~1% of a
# request); other paths are passthroughs', the most recent kept.
_parsed_url = lru_cache(maxsize=64)(URL)


class UpstreamStreamBroken(Exception):
    """The upstream body stopped after it had begun (stall past the idle limit, or reset).

    ``code`` is what the client is told (in-band for a stream, else in the error body).
    """

    def __init__(self, message: str, *, timeout: bool) -> None:
        super().__init__(message)
        self.timeout = timeout
        self.code = "upstream_timeout" if timeout else "upstream_stream_broken"


class UpstreamResponseTooLarge(UpstreamStreamBroken):
    """The answer went past ``upstream.max_response_bytes`` (decoded, when read decoded)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the upstream's answer is larger than the {limit}-byte limit"
            " (upstream.max_response_bytes)",
            timeout=False,
        )
        self.code = "upstream_response_too_large"


class _WriteStalled(Exception):
    """One write of the request body took longer than ``write_s`` (the upstream stopped reading)."""


class _PoolFull(Exception):
    """No pooled connection came free within ``pool_s``."""


class _BoundedWaitConnector(aiohttp.TCPConnector):
    """A connector whose wait for a free connection (all ``limit`` busy) ends after
    ``pool_s`` with ``_PoolFull``.

    aiohttp bounds that wait only together with the TCP connect (its ``connect``
    timeout), so the wait is bounded here, in the one method that waits. It is private:
    checked in ``_session``, so a renamed method fails at start-up rather than leaving the
    wait unbounded. (aiohttp's public tracing signals can tell a request is waiting, but
    every request then pays for them: ~16 µs of CPU each, measured; this costs nothing
    until the pool is full.)
    """

    def __init__(self, *, pool_s: float, **options: Any) -> None:
        super().__init__(**options)
        self.pool_s = pool_s

    async def _wait_for_available_connection(self, *args: Any, **kwargs: Any) -> None:
        try:
            async with asyncio.timeout(self.pool_s):
                await super()._wait_for_available_connection(*args, **kwargs)
        except TimeoutError:
            raise _PoolFull from None


def _session(
    *, limit: int = 100, keepalive_s: float = 15.0, pool_s: float | None = None
) -> aiohttp.ClientSession:
    options: dict[str, Any] = {"limit": limit, "limit_per_host": 0}
    options["keepalive_timeout"] = keepalive_s
    if pool_s is None:
        connector = aiohttp.TCPConnector(**options)
    else:
        # Private, so checked: a renamed method must fail here, not leave waits unbounded.
        if not hasattr(aiohttp.TCPConnector, "_wait_for_available_connection"):
            raise RuntimeError("aiohttp no longer has _wait_for_available_connection")
        connector = _BoundedWaitConnector(pool_s=pool_s, **options)
    session = aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        skip_auto_headers=_AUTO_HEADERS,
        # No client-wide limits: each phase is bounded where it happens (see Upstream).
        timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
    )
    # Private, so checked: a renamed flag must fail here, not silently start retrying.
    if not hasattr(session, "_retry_connection"):
        raise RuntimeError("aiohttp no longer has _retry_connection: cannot disable retries")
    session._retry_connection = False
    return session


class _Body(aiohttp.payload.Payload):
    """The request body, each write bounded by ``write_s``.

    Bytes go out with a Content-Length, an async iterator (a client's body still
    arriving) chunked. Only the writes are timed, not the waits for the client's next
    chunk: a slow client is not a stalled upstream.
    """

    def __init__(self, content: bytes | AsyncIterator[bytes], write_s: float) -> None:
        super().__init__(content)
        self.write_s = write_s
        if isinstance(content, bytes):
            self._size = len(content)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        raise TypeError("a streamed request body is not decoded")

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        if isinstance(self._value, bytes):
            await self._write(writer, self._value)
            return
        async for chunk in self._value:
            await self._write(writer, chunk)

    async def _write(self, writer: AbstractStreamWriter, chunk: bytes) -> None:
        if writer.buffer_size + len(chunk) <= _UNDRAINED:
            await writer.write(chunk)  # buffered by the transport: no wait to bound
            return
        try:
            async with asyncio.timeout(self.write_s):
                await writer.write(chunk)
        except TimeoutError:
            raise _WriteStalled(
                f"upstream took more than {self.write_s:g} s to accept the request body"
            ) from None


async def _inflated(pieces: Iterator[bytes]) -> tuple[list[bytes], Exception | None]:
    """A compressed chunk's decoded pieces, and the error that ended them if one did: the
    first ``HEAVY_CHARS`` of them made on the loop, the rest (a chunk that decodes to
    megabytes: a gzip "bomb" inflates up to the answer limit) in the heavy-work pool, so
    that other requests are not held while it inflates."""
    out: list[bytes] = []
    size = 0
    try:
        for piece in pieces:
            out.append(piece)
            size += len(piece)
            if size >= offload.HEAVY_CHARS:
                return await offload.off_loop(_drained, pieces, out)
    except (UpstreamResponseTooLarge, zlib.error) as error:
        return out, error.with_traceback(None)
    return out, None


def _drained(pieces: Iterator[bytes], out: list[bytes]) -> tuple[list[bytes], Exception | None]:
    try:
        out.extend(pieces)
    except (UpstreamResponseTooLarge, zlib.error) as error:
        # Without its traceback: the frames in it hold ``out``, tens of MB, which would
        # then live as long as the error (and, in a cycle, until a full collection).
        return out, error.with_traceback(None)
    return out, None


class _Decoder:
    """Undoes a Content-Encoding of gzip or deflate (anything else passes as it is), and
    counts what it gives out against ``limit``: past it, ``UpstreamResponseTooLarge``.

    Compressed input is inflated at most ``_DECODED_PIECE`` bytes at a time (zlib's
    ``max_length``; the rest of the input waits in ``unconsumed_tail``), so going past
    the limit is found having made at most one piece more, whatever the input holds.
    """

    def __init__(self, encoding: str, limit: int) -> None:
        self._zlib: Any = None
        self._deflate = False
        self._limit = limit
        self._left = limit
        if encoding in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._zlib = zlib.decompressobj()
            self._deflate = True

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        """``chunk`` decoded, in pieces; raises ``zlib.error`` on a body that does not decode."""
        if self._zlib is None:
            if chunk:
                yield self._counted(chunk)
            return
        data = chunk
        while True:
            piece = self._inflate(data)
            if piece:
                yield self._counted(piece)
            data = self._zlib.unconsumed_tail
            # A full piece may leave output pending inside zlib even with no input left.
            if not data and len(piece) < _DECODED_PIECE:
                return

    def flush(self) -> Iterator[bytes]:
        """What is left once the body has ended (all input was fed, in pieces: little)."""
        if self._zlib is not None:
            rest = bytes(self._zlib.flush())
            if rest:
                yield self._counted(rest)

    def _inflate(self, data: bytes) -> bytes:
        try:
            return bytes(self._zlib.decompress(data, _DECODED_PIECE))
        except zlib.error:
            if not self._deflate:
                raise
            # "deflate" is often sent without its zlib header: retry as raw deflate.
            self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
            self._deflate = False
            return bytes(self._zlib.decompress(data, _DECODED_PIECE))

    @property
    def compressed(self) -> bool:
        return self._zlib is not None

    def _counted(self, piece: bytes) -> bytes:
        self._left -= len(piece)
        if self._left < 0:
            raise UpstreamResponseTooLarge(self._limit)
        return piece


# What ends an event of an event stream: a blank line (after "\n", "\r" or "\r\n").
_EVENT_ENDS = (b"\n\n", b"\r\r", b"\r\n\r\n")


def _event_end(data: bytes) -> int:
    """Just past the last event end in ``data``; 0 if it holds none."""
    end = 0
    for mark in _EVENT_ENDS:
        at = data.rfind(mark)
        if at != -1:
            end = max(end, at + len(mark))
    return end


class _WholeEvents:
    """Passes an event stream on in whole events, holding back the start of one that is
    still arriving. When the stream breaks (or outgrows its limit) what the client has
    then ends with an event, so the in-band error the gateway adds is read as one; a half
    event before it would merge with it into a line no client can parse.

    The held pieces are kept apart and joined once their event ends: a long event that
    arrives in many pieces is copied once, not once a piece.
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: list[bytes] = []

    def feed(self, piece: bytes) -> bytes:
        """The bytes of ``piece`` (and of what was held) up to the last event end."""
        if not self._held:
            if piece.endswith(b"\n\n"):
                return piece  # the usual piece: whole events
            end = _event_end(piece)
            if end < len(piece):
                self._held.append(piece[end:])
            return piece[:end]
        tail = self._held[-1][-3:]  # an event end may straddle the two
        end = _event_end(tail + piece) - len(tail)
        if end <= 0:
            self._held.append(piece)
            return b""
        out = b"".join(self._held) + piece[:end]
        self._held = [piece[end:]] if end < len(piece) else []
        return out

    def rest(self) -> bytes:
        """What is held once the stream has ended cleanly: relayed as it came."""
        rest, self._held = b"".join(self._held), []
        return rest


def _buffered(content: aiohttp.StreamReader) -> bytes:
    """The bytes that arrived before the connection broke, taken out of the reader.

    Once a connection breaks, aiohttp's reads raise at once and leave what was already
    received in the buffer; a relay must pass those bytes on (a client would otherwise
    lose the last tokens it was sent). The buffer is private, hence the care.
    """
    buffer = getattr(content, "_buffer", None)
    if not buffer:
        return b""
    data = b"".join(bytes(part) for part in buffer)
    buffer.clear()
    return data


class UpstreamResponse:
    """An upstream answer whose headers have arrived and whose body is still to read."""

    def __init__(
        self, response: aiohttp.ClientResponse, idle_s: float, max_bytes: int = 32 << 20
    ) -> None:
        self._response = response
        self._idle_s = idle_s
        self._max_bytes = max_bytes
        self.status_code = response.status
        self.headers = [
            (name.decode("latin-1").lower(), value.decode("latin-1"))
            for name, value in response.raw_headers
        ]

    async def iter_body(self, *, decoded: bool) -> AsyncIterator[bytes]:
        """The body as it arrives; ``decoded`` undoes content-encoding (to read it).

        At most ``max_bytes`` of it (decoded, when decoded): then ``UpstreamResponseTooLarge``.
        """
        headers = self._response.headers
        encoding = headers.get("content-encoding", "").strip().lower()
        decoder = _Decoder(encoding if decoded else "identity", self._max_bytes)
        # An event stream read by the gateway is passed on in whole events, so that it
        # can end with an in-band error of its own (the chat route's).
        event_stream = "text/event-stream" in headers.get("content-type", "").lower()
        events = _WholeEvents() if decoded and event_stream else None
        content = self._response.content
        unbroken = 0  # bytes taken since the loop last ran anything else
        while True:
            try:
                # What has arrived is taken without a timer (~6 µs each: a fast upstream
                # sends a whole answer at once); only a wait for more is bounded.
                chunk = content.read_nowait(_UNBROKEN_BYTES)
                if not chunk and not content.is_eof():
                    unbroken = 0
                    async with asyncio.timeout(self._idle_s):
                        chunk = await content.readany()
                elif unbroken > _UNBROKEN_BYTES:
                    # An upstream that always has more (and a client that takes it all)
                    # would keep this task running, and every other request waiting, for
                    # as long as the answer lasts: 120 ms at a time for a 100 MB one. In
                    # pieces of this size, a request waits at most ~1 ms for each turn.
                    unbroken = 0
                    await asyncio.sleep(0)
                unbroken += len(chunk)
            except TimeoutError:
                raise UpstreamStreamBroken(
                    f"upstream sent nothing for {self._idle_s:g} s", timeout=True
                ) from None
            except (aiohttp.ClientError, OSError) as error:
                broken = UpstreamStreamBroken(
                    f"upstream stream broke: {type(error).__name__}", timeout=False
                )
                break
            try:
                decoding = decoder.feed(chunk) if chunk else decoder.flush()
                pieces: Iterable[bytes] = decoding
                failure = None
                if decoder.compressed:
                    pieces, failure = await _inflated(decoding)
                for piece in pieces:
                    if events is not None:
                        piece = events.feed(piece)
                        if not piece:
                            continue
                    yield piece
                if failure is not None:
                    # Raised from here, the error's traceback holds this frame: not the
                    # decoded answer (tens of MB), nor the error itself (a cycle, freed
                    # only by a full collection, rare in a serving process).
                    too_much, failure = failure, None
                    del pieces, decoding
                    try:
                        raise too_much
                    finally:
                        del too_much
            except zlib.error as error:
                raise UpstreamStreamBroken(
                    f"upstream stream broke: {type(error).__name__}", timeout=False
                ) from None
            if not chunk:
                if events is not None and (rest := events.rest()):
                    yield rest
                return
        # Relay what the upstream did send before it broke (whole events of it, for an
        # event stream), then report the break.
        rest = _buffered(content)
        with contextlib.suppress(zlib.error, UpstreamResponseTooLarge):
            for piece in decoder.feed(rest):
                if events is not None:
                    piece = events.feed(piece)
                if piece:
                    yield piece
        raise broken

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_body(decoded=True)])

    async def aclose(self) -> None:
        # A body read to its end leaves the connection reusable; anything else closes it.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


def _header_value(name: str, value: str) -> str:
    """The str aiohttp must be given to send the client's bytes unchanged.

    The ASGI server decoded the client's header bytes as latin-1; aiohttp encodes values
    as UTF-8. Re-reading the bytes as UTF-8 sends them back exactly; bytes that are not
    UTF-8 cannot be sent as they came, so they are refused rather than altered.
    """
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise InvalidRequest(
            f"header {name} is not valid UTF-8 and cannot be forwarded unchanged",
            code="invalid_header_encoding",
        ) from None


class Upstream:
    """Sends requests to the configured OpenAI-compatible base URL."""

    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self.base_url = config.base_url.rstrip("/")
        self._client: aiohttp.ClientSession | None = None
        # aiohttp's connect covers the wait for a pooled connection (bounded on its own
        # by pool_s, see _BoundedWaitConnector), DNS and the TCP connect; connect_s is
        # the part after the wait, and sock_connect the TCP connect itself.
        timeouts = config.timeouts
        self._connect = aiohttp.ClientTimeout(
            total=None,
            connect=timeouts.pool_s + timeouts.connect_s,
            sock_connect=timeouts.connect_s,
            sock_read=None,
        )

    @property
    def client(self) -> aiohttp.ClientSession:
        if self._client is None:
            self._client = _session(
                limit=self.config.max_connections,
                keepalive_s=self.config.keepalive_s,
                pool_s=self.config.timeouts.pool_s,
            )
        return self._client

    def url(self, path: str) -> str:
        """``/v1/models`` → ``{base_url}/models``: the base URL already names the version."""
        suffix = path[3:] if path.startswith("/v1/") or path == "/v1" else path
        return self.base_url + suffix

    def _target(self, path: str, query: bytes) -> URL:
        # The path quoted as needed (it arrives decoded); the query raw, not re-encoded,
        # and none at all (not a bare "?") when it is empty.
        url = _parsed_url(self.url(path))
        if not query:
            return url
        raw_query = quote_from_bytes(query, safe=_QUERY_SAFE)
        return URL(str(url) + "?" + raw_query, encoded=True)

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
        sent = [(name, _header_value(name, value)) for name, value in headers]
        timeouts = self.config.timeouts
        try:
            async with asyncio.timeout(timeouts.first_byte_s):
                response = await self.client.request(
                    method,
                    self._target(path, query),
                    headers=sent,
                    # No body at all rather than an empty one: no Content-Length: 0 on a GET.
                    data=None if content == b"" else _Body(content, timeouts.write_s),
                    allow_redirects=False,
                    timeout=self._connect,
                )
        except _PoolFull:
            raise UpstreamPoolFull(
                f"all {self.config.max_connections} upstream connections stayed busy"
                f" for {timeouts.pool_s:g} s; retry shortly"
            ) from None
        except TimeoutError as error:
            if isinstance(error, aiohttp.ConnectionTimeoutError):
                raise UpstreamTimeout("timed out connecting to the upstream") from None
            raise UpstreamTimeout(
                f"upstream sent no response within {timeouts.first_byte_s:g} s"
            ) from None
        except aiohttp.ClientError as error:
            if isinstance(error.__cause__, _WriteStalled):
                raise UpstreamTimeout(str(error.__cause__)) from None
            raise UpstreamUnreachable(
                f"cannot reach the upstream: {type(error).__name__}"
            ) from None
        except OSError as error:
            raise UpstreamUnreachable(
                f"cannot reach the upstream: {type(error).__name__}"
            ) from None
        return UpstreamResponse(response, timeouts.idle_s, self.config.max_response_bytes)

    async def accepts_key(self, key: str, timeout_s: float = 5.0) -> bool | None:
        """Whether the upstream takes this key (a ``GET /models`` with it): False when it
        answers 401 or 403, True for any other answer (a server without /models still
        did not refuse it), None when it cannot be reached in ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                response = await self.open(
                    "GET", "/v1/models", headers=[("authorization", f"Bearer {key}")], content=b""
                )
                try:
                    status = response.status_code
                finally:
                    await response.aclose()
        except (TimeoutError, UpstreamTimeout, UpstreamUnreachable, UpstreamPoolFull):
            return None
        if status in (401, 403):
            return False
        return None if status >= 500 else True

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()


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
            self._client = _session()
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
                    raw = await response.read()
        except TimeoutError:
            raise self.error(f"{self.what} sent no answer within {self.timeout_s:g} s") from None
        except (aiohttp.ClientError, OSError) as error:
            raise self.error(f"cannot reach the {self.what}: {type(error).__name__}") from None
        if status != 200:
            raise self.error(f"{self.what} answered {status}")
        try:
            return json.loads(raw)
        except ValueError:
            raise self.error(f"{self.what} sent a malformed body") from None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()


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
