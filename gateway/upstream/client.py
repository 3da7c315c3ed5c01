"""The upstream client: with ``models`` (the background models' clients, on the same
session rules), the only module that imports an HTTP client library (aiohttp).

Why aiohttp and not httpx: with hundreds of concurrent streams httpx 0.28's pool spends
time proportional to its connection count on every request and release, under a lock
(httpx issue #3215); see docs/decisions.md for the measurements.

Choices, each for a reason:

* one shared ``ClientSession`` (connection reuse), made on first use (aiohttp wants a
  running loop), whose ``DummyCookieJar`` neither keeps nor sends cookies: a kept
  ``Set-Cookie`` would be replayed for every other client of the gateway;
* redirects are never followed and nothing is retried: a POST that reached the upstream
  may have been billed and acted upon. aiohttp resends an idempotent request once when a
  kept-alive connection turns out closed; that is switched off (``compat.aiohttp``);
* only the client's headers go upstream: aiohttp's own Accept, Accept-Encoding,
  User-Agent and Content-Type are skipped, and bodies arrive raw (``auto_decompress``
  off) so a passthrough relays them byte for byte; ``decoded`` undoes gzip/deflate here;
* connect, time to first byte, silence between chunks and each body write have their
  own limits and their own errors, enforced here rather than by one client-wide timeout;
* the wait for a pooled connection when all are busy has its own short deadline
  (``pool_s``), then a 503: a pool held by streams nobody reads must not make every
  other request wait out the connect timeout;
* an answer's size is bounded (``max_response_bytes``), counted after decoding: a
  compressed body is inflated in bounded pieces, so a gzip bomb stops at the limit
  (``body``).
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncIterator, Iterable
from typing import Any
from urllib.parse import quote_from_bytes

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from yarl import URL

from gateway.caching import memo
from gateway.compat.aiohttp import (
    WRITE_DRAIN_BYTES,
    BoundedWaitConnector,
    PoolWaitExpired,
    take_buffered,
    without_retries,
)
from gateway.config import UpstreamConfig
from gateway.errors import InvalidRequest, UpstreamPoolFull, UpstreamTimeout, UpstreamUnreachable
from gateway.upstream.body import (
    Decoder,
    UpstreamResponseTooLarge,
    UpstreamStreamBroken,
    WholeEvents,
    inflated,
)

# aiohttp adds these unless told not to; a transparent proxy sends the client's only.
_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
# Bytes a query may carry as they are; anything else (non-ASCII) is percent-encoded.
_QUERY_SAFE = bytes(range(0x21, 0x7F))
# Bytes relayed before the other requests get their turn on the loop (see iter_body).
_UNBROKEN_BYTES = 1 << 16
_BODY_PIECE_BYTES = 1 << 18


class _WriteStalled(Exception):
    """One write of the request body took longer than ``write_s`` (the upstream stopped reading)."""


def client_session(
    *, limit: int = 100, keepalive_s: float = 15.0, pool_s: float | None = None
) -> aiohttp.ClientSession:
    options: dict[str, Any] = {"limit": limit, "limit_per_host": 0}
    options["keepalive_timeout"] = keepalive_s
    if pool_s is None:
        connector = aiohttp.TCPConnector(**options)
    else:
        # The wait for a pooled connection, bounded on its own (then a 503).
        connector = BoundedWaitConnector(pool_s=pool_s, **options)
    session = aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        skip_auto_headers=_AUTO_HEADERS,
        # No client-wide limits: each phase is bounded where it happens (see Upstream).
        timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
    )
    return without_retries(session)


class _Body(aiohttp.payload.Payload):
    """The request body, each write bounded by ``write_s``.

    Bytes go out with a Content-Length, an async iterator (a client's body still
    arriving) chunked. Only the writes are timed, not the waits for the client's next
    chunk: a slow client is not a stalled upstream.
    """

    def __init__(self, content: bytes | AsyncIterator[bytes], write_s: float) -> None:
        super().__init__(content)
        self.content = content
        self.write_s = write_s

    @property
    def size(self) -> int | None:
        """The Content-Length: none for a body still arriving (sent chunked)."""
        return len(self.content) if isinstance(self.content, bytes) else None

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        raise TypeError("a streamed request body is not decoded")

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        if isinstance(self.content, bytes):
            # A large body in pieces, the loop's other work between them: one write of
            # 3.4 MB held the event loop ~3 ms (the kernel copies it, and on loopback
            # delivers it, in that call), which every other request waited out.
            whole = memoryview(self.content)
            for start in range(0, len(whole), _BODY_PIECE_BYTES):
                if start:
                    await asyncio.sleep(0)
                await self._write(writer, whole[start : start + _BODY_PIECE_BYTES])
            return
        async for chunk in self.content:
            await self._write(writer, chunk)

    async def _write(self, writer: AbstractStreamWriter, chunk: bytes | memoryview) -> None:
        if writer.buffer_size + len(chunk) <= WRITE_DRAIN_BYTES:
            await writer.write(chunk)  # buffered by the transport: no wait to bound
            return
        try:
            async with asyncio.timeout(self.write_s):
                await writer.write(chunk)
        except TimeoutError:
            raise _WriteStalled(
                f"upstream took more than {self.write_s:g} s to accept the request body"
            ) from None


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

    async def iter_body(self, *, decoded: bool) -> AsyncIterator[bytes]:  # noqa: C901 (17)
        """The body as it arrives; ``decoded`` undoes content-encoding (to read it).

        At most ``max_bytes`` of it (decoded, when decoded): then ``UpstreamResponseTooLarge``.
        """
        headers = self._response.headers
        encoding = headers.get("content-encoding", "").strip().lower()
        decoder = Decoder(encoding if decoded else "identity", self._max_bytes)
        # An event stream read by the gateway is passed on in whole events, so that it
        # can end with an in-band error of its own (the chat route's).
        event_stream = "text/event-stream" in headers.get("content-type", "").lower()
        events = WholeEvents() if decoded and event_stream else None
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
                    pieces, failure = await inflated(decoding)
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
        # event stream), then report the break: a client would otherwise lose the last
        # tokens it was sent.
        rest = take_buffered(content)
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
    """Sends requests to the configured OpenAI-compatible base URL (or, made by
    ``anthropic``, to the Anthropic-compatible one)."""

    def __init__(
        self,
        config: UpstreamConfig,
        *,
        key_header: str = "authorization",
        own_key: str | None = None,
        keys_of_its_own: bool = False,
    ) -> None:
        self.config = config
        self.base_url = config.base_url.rstrip("/")
        self.key_header = key_header  # where it reads a key (``upstream.headers``)
        self._own_key = own_key
        self._keys_of_its_own = keys_of_its_own
        self._client: aiohttp.ClientSession | None = None
        # Parsed once per URL: the chat path is every request's (yarl's parse is ~1% of a
        # request); other paths are passthroughs', the most recent kept.
        self._parsed_url = memo(maxsize=64)(URL)
        # aiohttp's connect covers the wait for a pooled connection (bounded on its own
        # by pool_s, see compat.aiohttp.BoundedWaitConnector), DNS and the TCP connect; connect_s is
        # the part after the wait, and sock_connect the TCP connect itself.
        timeouts = config.timeouts
        self._connect = aiohttp.ClientTimeout(
            total=None,
            connect=timeouts.pool_s + timeouts.connect_s,
            sock_connect=timeouts.connect_s,
            sock_read=None,
        )

    @classmethod
    def anthropic(cls, config: UpstreamConfig) -> Upstream:
        """The Messages API's upstream (``upstream.anthropic_base_url``): its key is
        ``upstream.anthropic_api_key``, sent as ``x-api-key``."""
        at = config.model_copy(update={"base_url": config.anthropic_base_url})
        return cls(
            at, key_header="x-api-key", own_key=config.anthropic_api_key, keys_of_its_own=True
        )

    def key_for(self, caller_key: str | None) -> str | None:
        """The key sent in a caller's stead, ``Caller.upstream_key`` (None: the client's
        own). An upstream with keys of its own takes its own wherever the caller's would
        have been the operator's ("": none configured, none sent)."""
        if caller_key is None or not self._keys_of_its_own:
            return caller_key
        return self._own_key or ""

    @property
    def client(self) -> aiohttp.ClientSession:
        if self._client is None:
            self._client = client_session(
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
        url = self._parsed_url(self.url(path))
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
        except PoolWaitExpired:
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
