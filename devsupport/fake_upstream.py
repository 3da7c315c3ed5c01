"""A fake OpenAI-compatible upstream: a real Starlette app served on a real socket.

Its "model" knows only what is in the context it receives: asked "what is my X?" it looks
for "my X is Y" in the messages it was sent. A memory test passes only if the gateway
really forwarded the remembered message. The ``model`` field selects a behaviour:

    fake-model       answers from its context (the default)
    slow-stream      five chunks 0.3 s apart
    tool-caller      calls get_weather, then answers from the tool result
    dotted-tool-caller  tool-caller's, but calls weather.get (a name OpenAI refuses, as a
                     model may make up a tool's name)
    error-500        500 with an OpenAI error body
    error-html       503 with an HTML body, as a load balancer in front would send
    rate-limit       429 with Retry-After: 7
    slow-first-byte  waits 3 s before the response headers (a client leaving is noticed)
    slow-first-chunk headers at once, then 3 s before the first chunk
    slow-done        the whole answer, then 0.3 s before ``[DONE]``
    stall-stream     two chunks, then silence for 30 s
    break-stream     two chunks, then the connection is cut
    not-sse          a JSON completion even when asked to stream
    malformed-sse    a data line of broken JSON and a line that is no SSE field, mixed in
    sse-noise        comments, unknown fields and lines that are no SSE field, mixed in
    sse-garbage-bytes  a line of binary garbage (not UTF-8) mixed in
    sse-invalid-utf8   a content chunk whose text is not UTF-8
    sse-huge-line    a 3 MiB data line mixed in
    sse-big-chunk    the answer with a 512 KiB word, in one chunk
    sse-no-done      ends with a finish_reason but no ``[DONE]``
    sse-truncated    two chunks, then a clean close: no finish_reason, no ``[DONE]``
    fake-summarizer  a deterministic, valid answer to each summarizer prompt (by its
                     ``[memory-gateway:<kind>]`` marker), extracted from the prompt
    broken-summarizer  an invalid summary ("Certainly! Here's a poem: ...") for every kind
    slow-summarizer  fake-summarizer's answers, each after SLOW_SUMMARIZER_S seconds (a
                     summarization job kept in flight)
    huge-answer      an answer of HUGE_ANSWER_BYTES (100 MB), streamed or not, made as sent
    gzip-bomb        an answer of ~52 MB, gzipped to ~51 KB (Content-Encoding: gzip),
                     streamed or not
    endless-stream   content chunks of ENDLESS_CHUNK_CHARS, one after another, until the
                     caller leaves (never a finish_reason)
    small-llamacpp   a model with a SMALL_CONTEXT_TOKENS window (by ``prompt_tokens``):
                     a longer prompt gets llama.cpp's 400 (exceed_context_size_error, with
                     n_ctx and n_prompt_tokens); otherwise fake-model's answer
    small-openai     the same window, refused as OpenAI does (code
                     context_length_exceeded, the numbers only in the message)
    small-bare       the same window, refused with only older llama.cpp's message ("the
                     request exceeds the available context size", no numbers)
    cached-prompt    fake-model's answer; its usage (whole, or the stream's usage chunk)
                     says CACHED_TOKENS of the prompt came from the prompt cache
                     (``prompt_tokens_details.cached_tokens``; the others say nothing of it)

``POST /v1/responses`` speaks the Responses API (``fake_responses``), answering the same
way from its ``instructions`` and ``input``; ``POST /v1/messages`` (and its
``/count_tokens``) Anthropic's Messages API (``fake_anthropic``), from its ``system`` and
``messages``.

Every chat call is in ``in_flight`` until its response has ended; one that ended before
its answer did (the gateway went away, or the stream was cut) is in ``disconnects``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import json
import re
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from devsupport import fake_anthropic, fake_responses
from devsupport.fake_responses import CACHED_TOKENS
from gateway.memory.summary_rules import SECTIONS


@dataclass
class SeenRequest:
    method: str
    path: str
    query: bytes
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Disconnect(NamedTuple):
    at: float  # time.monotonic() when the fake noticed its caller was gone
    model: str
    prompt: str  # the text of the last message, to tell calls apart


@dataclass(eq=False)
class ChatCall:
    model: str
    prompt: str
    finished: bool = False  # the whole answer was handed to the server


# The bytes some models slip into an otherwise valid stream after its first word.
_INJECTED = {
    "malformed-sse": b"data: {not json\n\nthis line is not sse\n\n: comment\n\n",
    "sse-noise": b"this line is not sse\n: comment\nevent: ping\nid: 3\n\n",
    "sse-garbage-bytes": b"\x00\xff\xfe\x80 garbage \x9c\x00\n\n",
    "sse-invalid-utf8": b'data: {"choices":[{"index":0,"delta":{"content":" \xff\xfe"},'
    b'"finish_reason":null}]}\n\n',
    "sse-huge-line": b"data: " + b"x" * (3 << 20) + b"\n\n",
}
BIG_WORD = "w" * (512 << 10)
HUGE_ANSWER_BYTES = 100 * 1000 * 1000
BOMB_DECODED_BYTES = 52 * 1000 * 1000
ENDLESS_CHUNK_CHARS = 4096
SMALL_CONTEXT_TOKENS = 2048
# Events of answers too big to hold: made (or, for the bomb, compressed) as they are sent.
_BIG_EVENT_CHARS = 64 * 1024
_COMPLETION_HEAD = b'{"id":"chatcmpl-big","object":"chat.completion","created":0,"model":"m",'
_COMPLETION_HEAD += b'"choices":[{"index":0,"message":{"role":"assistant","content":"'
_COMPLETION_TAIL = b'"},"finish_reason":"stop"}]}'


def _content_event(text: str, finish: str | None = None) -> bytes:
    delta = {"content": text} if text else {}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    data = {"id": "chatcmpl-big", "object": "chat.completion.chunk", "created": 0,
            "model": "m", "choices": [choice]}  # fmt: skip
    return f"data: {json.dumps(data)}\n\n".encode()


def _big_answer(
    total: int, *, stream: bool, word: str = "lorem ipsum dolor sit amet "
) -> Iterator[bytes]:
    """An answer of about ``total`` bytes, one block at a time (never held whole)."""
    block = (word * (_BIG_EVENT_CHARS // len(word) + 1))[:_BIG_EVENT_CHARS]
    if not stream:
        yield _COMPLETION_HEAD
        for _ in range(total // len(block)):
            yield block.encode()
        yield _COMPLETION_TAIL
        return
    event = _content_event(block)
    for _ in range(total // len(event)):
        yield event
    yield _content_event("", "stop")
    yield b"data: [DONE]\n\n"


@functools.cache
def gzip_bomb(stream: bool) -> bytes:
    """~52 MB of answer gzipped to ~51 KB (compressed once, block by block)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    answer = _big_answer(BOMB_DECODED_BYTES, stream=stream, word="a")
    packed = [packer.compress(part) for part in answer]
    return b"".join(packed) + packer.flush()


class _Tracked:
    """Runs a response, then tells the fake that the call is over, however it ended."""

    def __init__(self, response: Response, call: ChatCall, fake: FakeUpstream) -> None:
        self.response, self.call, self.fake = response, call, fake

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            self.fake.in_flight.discard(self.call)
            if not self.call.finished:
                self.fake.disconnects.append(
                    Disconnect(time.monotonic(), self.call.model, self.call.prompt)
                )


async def _client_left(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


@dataclass
class FakeUpstream:
    requests: list[SeenRequest] = field(default_factory=list)
    disconnects: list[Disconnect] = field(default_factory=list)
    in_flight: set[ChatCall] = field(default_factory=set)
    completed_streams: int = 0
    # Keys this upstream refuses (401 on every route), as a provider does a revoked key.
    rejected_keys: set[str] = field(default_factory=set)
    # The Responses API's stored output items (what an ``item_reference`` names).
    stored_items: fake_responses.StoredItems = field(default_factory=fake_responses.StoredItems)
    # Serve chat completions only, as llama-cpp-python, Ollama and many vLLM deployments
    # do: /v1/responses answers as their FastAPI does (404 {"detail": "Not Found"}).
    chat_only: bool = False
    # The Anthropic Messages API's state: its prompt cache (``anthropic.cache``).
    anthropic: fake_anthropic.FakeAnthropic = field(default_factory=fake_anthropic.FakeAnthropic)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/responses", self.responses, methods=["POST"]),
                Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.messages, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                Route("/v1/redirect", self.redirect, methods=["GET", "POST"]),
                Route(
                    "/v1/echo/{rest:path}",
                    self.echo,
                    methods=["GET", "POST", "PUT", "DELETE", "PATCH"],
                ),
            ]
        )

    def responses_requests(self) -> list[SeenRequest]:
        return [r for r in self.requests if r.path == "/v1/responses"]

    async def responses(self, request: Request) -> Response:
        """The Responses API (``fake_responses``): answers as ``chat`` does."""
        seen = await self._seen(request)
        if self.chat_only:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        refused = self._refused(request)
        if refused is not None:
            return refused
        body = self.stored_items.resolve(seen.json())
        if isinstance(body, Response):
            return body  # a reference to an item never stored
        model = body.get("model", "fake-model")
        messages = fake_responses.as_messages(body)
        failed = fake_responses.refusal(body, messages)
        if failed is not None:
            return failed
        if model in _SMALL_MODELS and prompt_tokens(messages) > SMALL_CONTEXT_TOKENS:
            return JSONResponse(_too_long(model, prompt_tokens(messages)), status_code=400)
        answer, calls = reply_to(messages, "fake-model" if model != "tool-caller" else model)
        response_id = f"resp_{next(self._ids)}"
        output = fake_responses.output_items(answer, calls)
        self.stored_items.keep(body, output)
        if not body.get("stream"):
            return fake_responses.complete(response_id, body, output)

        def finished() -> None:
            self.completed_streams += 1

        events = fake_responses.stream_events(response_id, body, output, finished)
        return StreamingResponse(events, media_type="text/event-stream")

    def messages_requests(self) -> list[SeenRequest]:
        return [r for r in self.requests if r.path == "/v1/messages"]

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API (``fake_anthropic``): answers as ``chat`` does."""
        seen = await self._seen(request)
        return self.anthropic.respond(
            seen.path, seen.headers, seen.body, reply_to, self.rejected_keys
        )

    def chat_requests(self) -> list[SeenRequest]:
        return [r for r in self.requests if r.path == "/v1/chat/completions"]

    def proxied_requests(self) -> list[SeenRequest]:
        """The requests a gateway forwarded for its clients, on any path: not its
        summarizer's chat calls.

        A gateway's worker takes any pending job in its Redis, another test's too, so a
        test that counts what was forwarded for it (or checks that nothing was) counts
        these.
        """
        return [r for r in self.requests if not _is_summarizers(r)]

    def last_messages(self) -> list[dict[str, Any]]:
        """The messages of the latest chat request that is not a summarizer's.

        Summary jobs (in the gateway's own worker or in a worker process) call this
        upstream beside the requests, and one may land after the turn a test checks.
        """
        for request in reversed(self.chat_requests()):
            messages = list(request.json()["messages"])
            if _summarizer_kind(messages) is None:
                return messages
        raise AssertionError("no chat request other than a summarizer's")

    async def _seen(self, request: Request) -> SeenRequest:
        seen = SeenRequest(
            method=request.method,
            path=request.url.path,
            query=request.scope.get("query_string", b""),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=await request.body(),
        )
        self.requests.append(seen)
        return seen

    def _cookie(self, response: Response) -> Response:
        response.set_cookie("upstream-session", f"s{next(self._ids)}")
        return response

    def _refused(self, request: Request) -> Response | None:
        """OpenAI's answer to a key it does not take, for the keys in ``rejected_keys``."""
        key = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if key not in self.rejected_keys:
            return None
        error = {"message": "Incorrect API key provided", "type": "invalid_request_error",
                 "param": None, "code": "invalid_api_key"}  # fmt: skip
        return JSONResponse({"error": error}, status_code=401)

    async def models(self, request: Request) -> Response:
        await self._seen(request)
        refused = self._refused(request)
        if refused is not None:
            return refused
        return self._cookie(
            JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        )

    async def embeddings(self, request: Request) -> Response:
        """Bag-of-words vectors that know a few synonyms: similar meaning, close vectors."""
        seen = await self._seen(request)
        body = seen.json()
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": fake_embedding(t)}
                for i, t in enumerate(texts)]  # fmt: skip
        return JSONResponse({"object": "list", "data": data, "model": body.get("model")})

    async def redirect(self, request: Request) -> Response:
        await self._seen(request)
        return RedirectResponse("/v1/models", status_code=302)

    async def echo(self, request: Request) -> Response:
        seen = await self._seen(request)
        status = int(request.query_params.get("status", "200"))
        return self._cookie(
            JSONResponse(
                {
                    "method": seen.method,
                    "path": seen.path,
                    "query": seen.query.decode(),
                    "headers": seen.headers,
                    "body": seen.body.decode(),
                },
                status_code=status,
                headers={"x-upstream": "echo", "keep-alive": "timeout=5"},
            )
        )

    async def chat(self, request: Request) -> Response:
        seen = await self._seen(request)
        refused = self._refused(request)
        if refused is not None:
            return refused
        body = seen.json()
        call = ChatCall(body.get("model", "fake-model"), _text(body["messages"][-1]))
        self.in_flight.add(call)
        try:
            response = await self._chat(request, body, call)
        except BaseException:
            self.in_flight.discard(call)
            raise
        # Starlette awaits whatever the endpoint returns as an ASGI app.
        return _Tracked(response, call, self)  # type: ignore[return-value]

    async def _chat(self, request: Request, body: dict[str, Any], call: ChatCall) -> Response:
        """The response for one chat call; ``call.finished`` once it holds the whole answer."""
        model = call.model
        messages = body["messages"]
        refused_part = part_chat_refuses(messages)
        if refused_part is not None:
            call.finished = True
            error = {"message": f"Invalid value: {refused_part!r}: not a content part type "
                     "of this role.", "type": "invalid_request_error",
                     "param": "messages", "code": "invalid_value"}  # fmt: skip
            return JSONResponse({"error": error}, status_code=400)
        unanswered = unanswered_calls(messages)
        if unanswered:
            call.finished = True
            message = (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(unanswered)}"
            )
            error = {"message": message, "type": "invalid_request_error",
                     "param": "messages", "code": None}  # fmt: skip
            return JSONResponse({"error": error}, status_code=400)
        if model == "error-html":
            call.finished = True
            html = "<html><body><h1>503 Service Unavailable</h1></body></html>"
            return Response(html, status_code=503, media_type="text/html")
        if model == "error-500":
            call.finished = True
            return JSONResponse(
                {
                    "error": {
                        "message": "upstream exploded",
                        "type": "server_error",
                        "param": None,
                        "code": None,
                    }
                },
                status_code=500,
            )
        if model in _SMALL_MODELS and prompt_tokens(messages) > SMALL_CONTEXT_TOKENS:
            call.finished = True
            return JSONResponse(_too_long(model, prompt_tokens(messages)), status_code=400)
        if model == "rate-limit":
            call.finished = True
            return JSONResponse(
                {
                    "error": {
                        "message": "slow down",
                        "type": "rate_limit_error",
                        "param": None,
                        "code": None,
                    }
                },
                status_code=429,
                headers={"retry-after": "7"},
            )
        if model == "slow-first-byte":
            try:
                async with asyncio.timeout(3):
                    await _client_left(request)
                return Response(status_code=499)  # the caller left: nothing to answer
            except TimeoutError:
                pass
        if model == "slow-summarizer":
            await asyncio.sleep(SLOW_SUMMARIZER_S)
        if model in ("huge-answer", "gzip-bomb", "endless-stream"):
            return self._oversized(call, model, stream=bool(body.get("stream")))
        answer, tool_calls = reply_to(messages, model)
        if model == "sse-big-chunk":
            answer = f"{answer} {BIG_WORD}"
        completion_id = f"chatcmpl-{next(self._ids)}"
        if not body.get("stream") or model == "not-sse":
            call.finished = True
            message: dict[str, Any] = {"role": "assistant", "content": answer}
            if tool_calls:
                message["tool_calls"] = tool_calls
            return self._cookie(
                JSONResponse(
                    {
                        "id": completion_id,
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "message": message,
                                "finish_reason": "tool_calls" if tool_calls else "stop",
                            }
                        ],
                        "usage": _usage(model),
                    }
                )
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        stream = self._stream(call, completion_id, answer, tool_calls, include_usage)
        if model == "late-one-chunk":  # 0.3 s, then the whole answer and [DONE] in one write
            stream = _late_in_one_write(stream)
        return self._cookie(
            StreamingResponse(
                stream,
                media_type="text/event-stream",
            )
        )

    async def _stream(
        self,
        call: ChatCall,
        completion_id: str,
        answer: str | None,
        tool_calls: list[dict[str, Any]] | None,
        include_usage: bool,
    ) -> AsyncIterator[bytes]:
        model = call.model

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(data)}\n\n".encode()

        delay = 0.3 if model == "slow-stream" else 0.0
        if model == "slow-first-chunk":
            await asyncio.sleep(3)
        yield chunk({"role": "assistant", "content": ""})
        if tool_calls:
            for i, tool_call in enumerate(tool_calls):
                args = tool_call["function"]["arguments"]
                name = tool_call["function"]["name"]
                head = {"index": i, "id": tool_call["id"], "type": "function",
                        "function": {"name": name, "arguments": ""}}  # fmt: skip
                yield chunk({"tool_calls": [head]})
                for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
                    yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
        else:
            words = (answer or "").split(" ")
            for n, word in enumerate(words):
                if n == 1 and model in _INJECTED:
                    yield _INJECTED[model]
                yield chunk({"content": word if n == 0 else " " + word})
                if n == 1 and model == "sse-truncated":
                    return
                if n == 1 and model in ("stall-stream", "break-stream"):
                    if model == "stall-stream":
                        await asyncio.sleep(30)
                    raise ConnectionAbortedError("fake upstream cuts the stream")
                if delay:
                    await asyncio.sleep(delay)
        yield chunk({}, "tool_calls" if tool_calls else "stop")
        if include_usage:
            data = {"id": completion_id, "object": "chat.completion.chunk", "created": 0,
                    "model": model, "choices": [], "usage": _usage(model)}  # fmt: skip
            yield f"data: {json.dumps(data)}\n\n".encode()
        if model == "slow-done":
            await asyncio.sleep(0.3)
        if model != "sse-no-done":
            yield b"data: [DONE]\n\n"
        call.finished = True
        self.completed_streams += 1

    def _oversized(self, call: ChatCall, model: str, *, stream: bool) -> Response:
        """The answers no gateway should hold whole: made as they are sent."""
        media_type = "text/event-stream" if stream else "application/json"
        if model == "gzip-bomb":
            call.finished = True  # all of it fits in one write
            return Response(
                gzip_bomb(stream), media_type=media_type, headers={"content-encoding": "gzip"}
            )

        async def body() -> AsyncIterator[bytes]:
            if model == "endless-stream":
                words = itertools.cycle(("alpha ", "beta ", "gamma ", "delta "))
                yield _content_event("")
                while True:
                    text = "".join(itertools.islice(words, ENDLESS_CHUNK_CHARS // 6))
                    yield _content_event(text)
                    await asyncio.sleep(0)  # the caller's leaving is noticed between chunks
            for part in _big_answer(HUGE_ANSWER_BYTES, stream=stream):
                yield part
                await asyncio.sleep(0)
            call.finished = True

        return StreamingResponse(body(), media_type=media_type)


async def _late_in_one_write(parts: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    await asyncio.sleep(0.3)
    yield b"".join([part async for part in parts])


def _usage(model: str) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    if model == "cached-prompt":
        usage["prompt_tokens_details"] = {"cached_tokens": CACHED_TOKENS}
    return usage


_ASK = re.compile(r"what is my ([a-z ]+?)\?", re.I)
_SMALL_MODELS = ("small-llamacpp", "small-openai", "small-bare")


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """The small models' count: a token every 3 characters, 4 a message (more than the
    gateway's count, as another tokenizer's may be)."""
    return sum(4 + len(_text(m)) // 3 for m in messages)


def _too_long(model: str, counted: int) -> dict[str, Any]:
    if model == "small-llamacpp":  # llama.cpp's server (2025)
        return {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": counted,
                "n_ctx": SMALL_CONTEXT_TOKENS,
            }
        }
    if model == "small-openai":
        return {
            "error": {
                "message": f"This model's maximum context length is {SMALL_CONTEXT_TOKENS} "
                f"tokens. However, your messages resulted in {counted} tokens. Please reduce "
                "the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    message = "the request exceeds the available context size. try increasing the context size"
    return {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


# The content part types OpenAI's chat completions take, by role (its API reference).
_CHAT_PART_TYPES = {
    "user": {"text", "image_url", "input_audio", "file"},
    "assistant": {"text", "refusal"},
    "tool": {"text"},
    "system": {"text"},
    "developer": {"text"},
}


def part_chat_refuses(messages: list[dict[str, Any]]) -> str | None:
    """The first content part type a message's role may not send, if any."""
    for message in messages:
        content = message.get("content")
        allowed = _CHAT_PART_TYPES.get(message.get("role", ""), set())
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in allowed:
                return str(kind)
    return None


def unanswered_calls(messages: list[dict[str, Any]]) -> list[str]:
    """The tool call ids of assistant messages that the tool messages right after them
    do not answer: OpenAI refuses such a conversation."""
    missing: list[str] = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            continue
        answered = set()
        for after in messages[i + 1 :]:
            if after.get("role") != "tool":
                break
            answered.add(after.get("tool_call_id"))
        missing += [c.get("id") for c in message["tool_calls"] if c.get("id") not in answered]
    return missing


def reply_to(
    messages: list[dict[str, Any]], model: str
) -> tuple[str | None, list[dict[str, Any]] | None]:
    """What the fake model says, knowing only ``messages``."""
    if model in ("fake-summarizer", "broken-summarizer", "slow-summarizer"):
        return summarizer_reply(messages, model), None
    last = messages[-1]
    if model in ("tool-caller", "dotted-tool-caller"):
        if last["role"] == "tool":
            return f"The tool said: {_text(last)}", None
        arguments = json.dumps({"city": "Paris"})
        name = "get_weather" if model == "tool-caller" else "weather.get"
        call = {"id": "call_1", "type": "function",
                "function": {"name": name, "arguments": arguments}}  # fmt: skip
        return None, [call]
    question = _ASK.search(_text(last))
    if question:
        attribute = question.group(1).strip()
        pattern = re.compile(rf"my {re.escape(attribute)} is ([\w-]+)", re.I)
        found = None
        for message in messages[:-1]:
            for match in pattern.finditer(_text(message)):
                found = match.group(1)
        if found:
            return f"Your {attribute} is {found}.", None
        return f"I don't know your {attribute}.", None
    return f"ack: {_text(last)}", None


# --- The fake summarizer model ---------------------------------------------------------

SLOW_SUMMARIZER_S = 1.5
BROKEN_SUMMARY = "Certainly! Here's a poem: roses bloom where silver rivers run all night."
_MARKER = re.compile(r"^\[memory-gateway:([a-z-]+)\]")
_MESSAGE_LINE = re.compile(r"^Message \d+ \((\w+)\): (.*)$", re.M)
_HEADING_LINE = re.compile(r"^#+\s+(.*?)\s*$")


def _head(text: str, words: int = 12) -> str:
    return " ".join(text.split()[:words])


def _between(text: str, start: str, end: str | None) -> str:
    """The text after ``start`` and before ``end`` (or the end of the text)."""
    if start not in text:
        return ""
    rest = text.split(start, 1)[1]
    return rest.split(end, 1)[0].strip() if end and end in rest else rest.strip()


def _user_lines(prompt: str) -> list[str]:
    found = [(role, text) for role, text in _MESSAGE_LINE.findall(prompt) if text.strip()]
    users = [text for role, text in found if role == "User"]
    return [_head(text) for text in users or [text for _, text in found]]


def _newest_within(lines: list[str], max_words: int) -> list[str]:
    """The newest lines whose words add up to at most ``max_words``."""
    kept: list[str] = []
    total = 0
    for line in reversed(lines):
        total += len(line.split())
        if total > max_words:
            break
        kept.insert(0, line)
    return kept


def _sectioned(previous: str, new: list[str], max_items: int) -> str:
    """Seed 001's four sections: the previous items kept, new lines in current context."""
    items: dict[str, list[str]] = {section: [] for section in SECTIONS}
    current = SECTIONS[1]
    for line in previous.splitlines():
        heading = _HEADING_LINE.match(line)
        if heading and heading.group(1) in items:
            current = heading.group(1)
        elif line.strip().startswith("- "):
            items[current].append(line.strip()[2:])
    items[SECTIONS[1]] += new
    return "\n\n".join(
        f"## {section}" + "".join(f"\n- {item}" for item in items[section][-max_items:])
        for section in SECTIONS
    )


def _is_summarizers(request: SeenRequest) -> bool:
    """A chat call of a gateway's summarizer (its prompt opens with the kind's marker)."""
    if request.path != "/v1/chat/completions":
        return False
    try:
        body = request.json()
    except ValueError:  # a body the test sent malformed on purpose: a client's
        return False
    messages = body.get("messages") if isinstance(body, dict) else None
    return isinstance(messages, list) and _summarizer_kind(messages) is not None


def _summarizer_kind(messages: list[dict[str, Any]]) -> str | None:
    """The kind a summarizer prompt names in its marker; None: not a summarizer's."""
    found = _MARKER.match(_text(messages[0])) if messages else None
    return found.group(1) if found else None


def summarizer_reply(messages: list[dict[str, Any]], model: str) -> str:
    """A valid answer to a summarizer prompt, built only from what the prompt holds."""
    if model == "broken-summarizer":
        return BROKEN_SUMMARY
    kind = _summarizer_kind(messages) or "chunk"
    prompt = _text(messages[-1])
    limit = re.search(r"under (\d+) words", _text(messages[0]) + prompt)
    max_words = int(limit.group(1)) if limit else 200
    if kind == "key-qa":
        question = _between(prompt, "QUESTION: ", "\nANSWER: ")
        answer = _between(prompt, "\nANSWER: ", None)
        asking = {"what", "which", "when", "where", "does", "have", "that", "this", "with"}
        words = [w for w in re.findall(r"[a-z]+", question.lower()) if len(w) >= 4]
        words = [w for w in words if w not in asking]
        tags = list(dict.fromkeys(words))[:3] or ["general"]
        return json.dumps({"q": _head(question, 20), "a": _head(answer, 30), "tags": tags})
    if kind == "facts":
        most = re.search(r"at most (\d+)", _text(messages[0]))
        count = int(most.group(1)) if most else 10
        texts = [t for role, t in _MESSAGE_LINE.findall(prompt) if role == "User"]
        facts = [
            _head(sentence, 20)
            for text in texts
            for sentence in re.split(r"(?<=[.!?])\s+", text)
            if "my " in sentence.lower() or any(c.isdigit() for c in sentence)
        ]
        return json.dumps(facts[:count])
    if kind.startswith("recursive"):
        previous = _between(prompt, "Previous Summary:\n", "\n\nNew User Content") or _between(
            prompt, "Summary:\n", "\n\nNew User Content"
        )
        max_items = 5 if kind == "recursive-compress" else 40
        return _sectioned(previous, _user_lines(prompt), max_items)
    if kind == "merge":
        parts = re.split(r"(?:^|\n\n)Summary \d+: ", prompt)
        lines = [_head(part) for part in parts if part.strip()]
    elif kind in ("fold", "compress"):
        previous = _between(prompt, "CURRENT SUMMARY:\n", "\nNEW ")
        lines = [] if previous == "(none yet)" else previous.splitlines()
        if kind == "fold":
            lines.append("User asked: " + _head(_between(prompt, "NEW QUESTION: ", "\n")))
        else:
            lines += ["User said: " + line for line in _user_lines(prompt)]
    else:
        lines = ["User said: " + line for line in _user_lines(prompt)]
    return "\n".join(_newest_within(lines, max_words)) or "User said nothing of note."


_SYNONYMS = {"automobile": "car", "vehicle": "car", "auto": "car", "bike": "bicycle",
             "puppy": "dog", "hound": "dog"}  # fmt: skip


_FUNCTION_WORD_TEXT = (
    "a an the is are was of on in at by to it i my me you your where there what which this "
    "that and or for from with"
)
_FUNCTION_WORDS = frozenset(_FUNCTION_WORD_TEXT.split())


def fake_embedding(text: str, dims: int = 64) -> list[float]:
    """A deterministic embedding: hashed words, synonyms folded together."""
    vector = [0.0] * dims
    for word in re.findall(r"[a-z]+", text.lower()):
        word = _SYNONYMS.get(word, word)
        if word in _FUNCTION_WORDS:
            continue  # they carry no meaning here
        vector[int(hashlib.sha256(word.encode()).hexdigest(), 16) % dims] += 1.0
    return vector
