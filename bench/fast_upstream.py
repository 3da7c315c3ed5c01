"""A fast fake OpenAI-compatible upstream for overhead benchmarks: raw asyncio, HTTP/1.1.

It must never be the bottleneck of what it measures, so it is a bare ``asyncio.Protocol``
(no framework, no routing, uvloop when installed): it parses a request's head and its
Content-Length body, and answers ``POST …/chat/completions`` with a fixed completion:

- ``"stream": true``: an SSE stream (chunked transfer encoding) of ``chunks`` content
  chunks, the first after ``ttft_ms`` and each next one ``spacing_ms`` later, then a
  finish chunk and ``data: [DONE]``;
- otherwise a JSON ``chat.completion`` after ``ttft_ms``.

``GET …/models`` lists the models. Anything else gets 404.

Abusive answers for ``bench/abuse.py``, chosen by a model name that starts with ``abuse-``
(written with flow control: the server sends only as fast as its reader takes, so a
gateway that stops reading holds the stream without this process buffering it):

- ``abuse-huge`` (``abuse-huge-m<MB>``): a 100 MB answer, one JSON completion with a
  ``Content-Length``, or an SSE stream of 1 KiB content pieces;
- ``abuse-gzip-bomb`` (``-m<MB>``): ``Content-Encoding: gzip``, ~51 KB on the wire that
  decode to a 52 MB completion (or event stream);
- ``abuse-endless`` (``abuse-endless-s<ms>``: one piece every ``ms``): an answer that
  never ends, as fast as it is read unless paced; a JSON one is an unending string.

Timings come from the command line (the defaults) or from the requested model's name:
one that contains ``t<ms>-c<chunks>-s<ms>`` (``bench-t0-c1-s0``, ``bench-t0-c7-s100``)
is served with those values, so one upstream serves every scenario of a run, through
any proxy that forwards the model name (LiteLLM strips its ``openai/`` prefix).

    python bench/fast_upstream.py --port 9000 --ttft-ms 0 --chunks 5 --spacing-ms 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import random
import re
import socket
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

try:  # ~7x the standard library's speed on a body of long strings (images): the
    # upstream is one event loop shared by every client of a run, and 3 ms of parsing
    # an attacker's 3.4 MB body was 3 ms every other request waited here.
    from pydantic_core import from_json as _loads
except ImportError:  # (run outside the gateway's environment)
    _loads = json.loads

_TIMING = re.compile(r"t(\d+)-c(\d+)-s(\d+)")
_MAX_HEAD = 64 * 1024


@dataclass(frozen=True)
class Timing:
    ttft_ms: float = 0.0
    chunks: int = 5
    spacing_ms: float = 0.0

    def for_model(self, model: str) -> Timing:
        found = _TIMING.search(model)
        if found is None:
            return self
        ttft, chunks, spacing = (int(g) for g in found.groups())
        return Timing(ttft_ms=ttft, chunks=max(1, chunks), spacing_ms=spacing)


def _head(status: str, content_type: str, extra: str) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\n{extra}"
        "connection: keep-alive\r\n\r\n"
    ).encode()


def _completion(model: str, chunks: int) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok " * chunks},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 10,
                "completion_tokens": chunks,
                "total_tokens": 10 + chunks,
            },
        }
    ).encode()


def _chunk(model: str, delta: dict[str, Any], finish: str | None) -> bytes:
    event = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    data = b"data: " + json.dumps(event).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


_DONE = b"data: [DONE]\n\n"
_DONE_CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(_DONE), _DONE)


# --- Abusive answers (bench/abuse.py) -----------------------------------------------------

_ABUSE = re.compile(r"abuse-(huge|gzip-bomb|endless)(?:-m(\d+))?(?:-s(\d+))?")
_MB = 1_000_000
_PIECE = 1024  # content characters per streamed event of an abusive answer
_WRITE_BATCH = 64 * 1024  # bytes written between two waits for the reader


@dataclass(frozen=True)
class Abuse:
    kind: str  # huge, gzip-bomb or endless
    size: int  # content bytes (0: endless)
    spacing_ms: float = 0.0

    @classmethod
    def for_model(cls, model: str) -> Abuse | None:
        found = _ABUSE.search(model)
        if found is None:
            return None
        kind, mb, spacing = found.groups()
        default_mb = {"huge": 100, "gzip-bomb": 52, "endless": 0}[kind]
        return cls(kind, int(mb or default_mb) * _MB, float(spacing or 0))


@lru_cache(maxsize=1)
def _text_block() -> str:
    """64 KiB of lowercase words (fixed seed): content a tokenizer has real work on."""
    rng = random.Random(22)
    words: list[str] = []
    length = 0
    while length < 64 * 1024:
        word = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9)))
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[: 64 * 1024]


@lru_cache(maxsize=1)
def _pieces() -> tuple[bytes, ...]:
    """Chunked SSE events of ``_PIECE`` characters each, cycled through by a stream."""
    block = _text_block()
    return tuple(
        _chunk("abuse", {"content": block[at : at + _PIECE]}, None)
        for at in range(0, len(block) - _PIECE + 1, _PIECE)
    )


def _completion_parts(model: str) -> tuple[bytes, bytes]:
    """A JSON completion split where its content goes: (before, after)."""
    marker = "\u0000CONTENT\u0000"
    whole = json.loads(_completion(model, 1))
    whole["choices"][0]["message"]["content"] = marker
    before, after = json.dumps(whole).split(json.dumps(marker)[1:-1])
    return before.encode(), after.encode()


@lru_cache(maxsize=4)
def _gzip_bomb(size: int, stream: bool) -> bytes:
    """A body of ``size`` repeated bytes, gzipped (~1,000:1: 52 MB is ~51 KB)."""
    if stream:
        event = _chunk("abuse", {"content": "a" * _PIECE}, None)
        data = event[event.index(b"\r\n") + 2 : -2]  # the event without its chunk framing
        body = data * (size // _PIECE) + _DONE
    else:
        before, after = _completion_parts("abuse")
        body = before + b"a" * size + after
    return gzip.compress(body, compresslevel=9)


def _dechunk(buffer: bytearray, start: int) -> tuple[bytes, int] | None:
    """A chunked body from ``start``: (body, bytes consumed), or None while incomplete."""
    body = bytearray()
    at = start
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        size = int(bytes(buffer[at:line_end]).split(b";")[0], 16)
        at = line_end + 2
        if size == 0:
            trailer_end = buffer.find(b"\r\n\r\n", at - 2)  # no trailers: just CRLF
            return (bytes(body), trailer_end + 4) if trailer_end >= 0 else None
        if len(buffer) < at + size + 2:
            return None
        body += buffer[at : at + size]
        at += size + 2


class _Connection(asyncio.Protocol):
    """One keep-alive client connection; requests on it are answered one after another."""

    def __init__(self, server: FastUpstream) -> None:
        self.server = server
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False  # answering a request (a pipelined next one waits in the buffer)
        self.writable = asyncio.Event()  # cleared while the reader lags (abusive answers wait)
        self.writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.writable.set()  # a writer waiting for the reader learns it is gone

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    async def _drain(self) -> None:
        """Wait until the reader took what was written (abusive answers only)."""
        await self.writable.wait()
        await asyncio.sleep(0)  # a reader as fast as us must not starve other connections
        if self.transport is None:
            raise ConnectionError("client gone")

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next_request()

    def _next_request(self) -> None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > _MAX_HEAD and self.transport is not None:
                self.transport.close()
            return
        head = bytes(self.buffer[:end]).decode("latin-1")
        lines = head.split("\r\n")
        method, _, rest = lines[0].partition(" ")
        path = rest.partition(" ")[0]
        length, chunked = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value.strip())
            elif name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        if chunked:
            found = _dechunk(self.buffer, end + 4)
            if found is None:
                return  # the body is still coming
            body, consumed = found
        else:
            if len(self.buffer) < end + 4 + length:
                return  # the body is still coming
            body, consumed = bytes(self.buffer[end + 4 : end + 4 + length]), end + 4 + length
        del self.buffer[:consumed]
        self.busy = True
        # Kept until done: the loop holds only weak references to tasks.
        task = asyncio.ensure_future(self._answer(method, path.partition("?")[0], body))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    async def _answer(self, method: str, path: str, body: bytes) -> None:
        try:
            await self._respond(method, path, body)
        except (ConnectionError, RuntimeError):
            if self.transport is not None:
                self.transport.close()
            return
        self.busy = False
        if self.buffer and self.transport is not None:
            self._next_request()

    def _write(self, data: bytes) -> None:
        if self.transport is None:
            raise ConnectionError("client gone")
        self.transport.write(data)

    async def _respond(self, method: str, path: str, body: bytes) -> None:
        self.server.requests += 1
        if method == "GET" and path.endswith("/models"):
            payload = json.dumps(
                {
                    "object": "list",
                    "data": [{"id": "bench", "object": "model", "owned_by": "bench"}],
                }
            ).encode()
            self._write(_head("200 OK", "application/json", f"content-length: {len(payload)}\r\n"))
            self._write(payload)
            return
        if method != "POST" or not path.endswith("/chat/completions"):
            payload = b'{"error": {"message": "not found", "type": "invalid_request_error"}}'
            self._write(
                _head("404 Not Found", "application/json", f"content-length: {len(payload)}\r\n")
            )
            self._write(payload)
            return
        try:
            request = _loads(body) if body else {}
        except ValueError:
            request = {}
        model = str(request.get("model", "bench"))
        abuse = Abuse.for_model(model)
        if abuse is not None:
            await self._abusive(abuse, model, bool(request.get("stream")))
            return
        timing = self.server.timing.for_model(model)
        if request.get("stream"):
            await self._stream(model, timing)
            return
        if timing.ttft_ms:
            await asyncio.sleep(timing.ttft_ms / 1000)
        payload = _completion(model, timing.chunks)
        self._write(
            _head("200 OK", "application/json", f"content-length: {len(payload)}\r\n") + payload
        )

    async def _stream(self, model: str, timing: Timing) -> None:
        self._write(_head("200 OK", "text/event-stream", "transfer-encoding: chunked\r\n"))
        if timing.ttft_ms:
            await asyncio.sleep(timing.ttft_ms / 1000)
        self._write(_chunk(model, {"role": "assistant", "content": "ok "}, None))
        for _ in range(timing.chunks - 1):
            if timing.spacing_ms:
                await asyncio.sleep(timing.spacing_ms / 1000)
            self._write(_chunk(model, {"content": "ok "}, None))
        self._write(_chunk(model, {}, "stop") + _DONE_CHUNKED)

    async def _abusive(self, abuse: Abuse, model: str, stream: bool) -> None:
        if abuse.kind == "gzip-bomb":
            body = _gzip_bomb(abuse.size, stream)
            kind = "text/event-stream" if stream else "application/json"
            extra = f"content-encoding: gzip\r\ncontent-length: {len(body)}\r\n"
            self._write(_head("200 OK", kind, extra))
            for at in range(0, len(body), _WRITE_BATCH):
                self._write(body[at : at + _WRITE_BATCH])
                await self._drain()
            return
        if stream:
            await self._abusive_stream(abuse, model)
        else:
            await self._abusive_json(abuse, model)

    async def _abusive_stream(self, abuse: Abuse, model: str) -> None:
        self._write(_head("200 OK", "text/event-stream", "transfer-encoding: chunked\r\n"))
        self._write(_chunk(model, {"role": "assistant", "content": ""}, None))
        pieces = _pieces()
        sent = written = 0
        while abuse.kind == "endless" or sent < abuse.size:
            piece = pieces[(sent // _PIECE) % len(pieces)]
            self._write(piece)
            sent += _PIECE
            written += len(piece)
            if abuse.spacing_ms:
                await asyncio.sleep(abuse.spacing_ms / 1000)
                await self._drain()
            elif written >= _WRITE_BATCH:
                written = 0
                await self._drain()
        self._write(_chunk(model, {}, "stop") + _DONE_CHUNKED)

    async def _abusive_json(self, abuse: Abuse, model: str) -> None:
        before, after = _completion_parts(model)
        block = _text_block().encode()
        if abuse.kind == "endless":
            self._write(_head("200 OK", "application/json", "transfer-encoding: chunked\r\n"))
            self._write(b"%x\r\n%s\r\n" % (len(before), before))
            piece = b"%x\r\n%s\r\n" % (len(block), block)
            while True:
                self._write(piece)
                if abuse.spacing_ms:
                    await asyncio.sleep(abuse.spacing_ms / 1000)
                await self._drain()
        length = len(before) + abuse.size + len(after)
        self._write(_head("200 OK", "application/json", f"content-length: {length}\r\n"))
        self._write(before)
        left = abuse.size
        while left > 0:
            self._write(block[:left])
            left -= len(block)
            await self._drain()
        self._write(after)


class FastUpstream:
    """The server: ``await start()`` in a running loop, or ``run()`` to own the process."""

    def __init__(self, timing: Timing, host: str = "127.0.0.1", port: int = 0) -> None:
        self.timing = timing
        self.host = host
        self.port = port
        self.requests = 0
        self.tasks: set[asyncio.Future[None]] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: _Connection(self), self.host, self.port, backlog=4096, reuse_address=True
        )
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self.port

    async def serve_forever(self) -> None:
        await self.start()
        assert self.server is not None
        print(f"fast upstream on http://{self.host}:{self.port}/v1", flush=True)
        await self.server.serve_forever()

    def run(self) -> None:
        try:
            import uvloop  # type: ignore[import-not-found]
        except ImportError:
            asyncio.run(self.serve_forever())
        else:
            uvloop.run(self.serve_forever())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first token")
    parser.add_argument("--chunks", type=int, default=5, help="content chunks per stream")
    parser.add_argument("--spacing-ms", type=float, default=0.0, help="delay between chunks")
    args = parser.parse_args()
    timing = Timing(ttft_ms=args.ttft_ms, chunks=max(1, args.chunks), spacing_ms=args.spacing_ms)
    with contextlib.suppress(KeyboardInterrupt):
        FastUpstream(timing, args.host, args.port).run()


if __name__ == "__main__":
    main()
