"""The fake upstream's Anthropic Messages API: ``POST /v1/messages`` (streamed or not)
and ``POST /v1/messages/count_tokens``, mounted on ``FakeUpstream``'s app.

It answers from its context exactly as the chat fake does (``reply_to`` over ``system``
and the ``messages`` read as chat messages, ``as_messages``), so a memory test passes only
if the gateway really forwarded the remembered message. It refuses what Anthropic's API
refuses, in Anthropic's error envelope (``fake_anthropic_rules``), and keeps a prompt
cache as Anthropic does, per ``x-api-key`` (``fake_anthropic_cache``: the usage's
``cache_read_input_tokens`` and ``cache_creation_input_tokens``). The ``model`` field
selects a behaviour; any name not below (``claude-fake``, ``claude-opus-4-8``, …)
answers from its context:

    tool-caller   calls get_weather (a ``tool_use`` block), then answers from the
                  ``tool_result``
    thinker       a ``thinking`` block (signed: a changed one is refused when sent back)
                  before its answer, when the request enables thinking
    slow-stream   text deltas 0.3 s apart
    error-500     500 ``api_error``
    overloaded    529 ``overloaded_error``
    rate-limit    429 ``rate_limit_error`` with Retry-After: 7
    cut-short     the answer, with ``stop_reason: max_tokens``
    fail-stream   streamed: an ``error`` event (overloaded_error) after the first text
                  delta, and no ``message_stop``; not streamed: answers as usual

A test may script an answer that breaks the API's rules (a malformed stream, JSON to a
streaming request): ``scripted[model] = (media type, body)``, answered 200 byte for byte.

Every request is recorded by ``FakeUpstream`` (``messages_requests()``: body, headers,
query such as Claude Code's ``beta=true``). Responses carry a ``request-id`` header.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from devsupport.fake_anthropic_cache import PromptCache, block_tokens
from devsupport.fake_anthropic_rules import (
    Refusal,
    api_key,
    header_refusal,
    refusal,
    signature,
)

# ``reply_to(messages, model)`` of fake_upstream: (answer, OpenAI-style tool calls).
Reply = Callable[[list[dict[str, Any]], str], tuple[str | None, list[dict[str, Any]] | None]]

THOUGHT = "The user asked something; I answer from what the conversation says."
_ERRORS = {
    "error-500": Refusal(500, "api_error", "Internal server error"),
    "overloaded": Refusal(529, "overloaded_error", "Overloaded"),
    "rate-limit": Refusal(
        429, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"
    ),
}


def _request_id() -> str:
    return f"req_{secrets.token_hex(12)}"


def error_response(refused: Refusal, headers: Mapping[str, str] | None = None) -> Response:
    """Anthropic's error envelope."""
    request_id = _request_id()
    body = {
        "type": "error",
        "error": {"type": refused.kind, "message": refused.message},
        "request_id": request_id,
    }
    return JSONResponse(
        body, status_code=refused.status, headers={"request-id": request_id, **(headers or {})}
    )


def _text(content: Any) -> str:
    """The text of a content (a string, or the text of its blocks)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content or ():
        if block.get("type") == "text":
            parts.append(block["text"])
        elif block.get("type") == "document":
            source = block.get("source") or {}
            if source.get("type") == "text":
                parts.append(str(source.get("data", "")))
    return " ".join(parts)


def as_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``system`` and ``messages`` as chat-like messages (what ``reply_to`` reads): a
    ``tool_result`` becomes a ``tool`` message. Mid-conversation system messages after
    the newest user or assistant message are moved before it, so that it is the one
    answered (Claude Code ends its first request with one)."""
    system = body.get("system")
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": _text(system)})
    for message in body["messages"]:
        role, content = message["role"], message["content"]
        blocks = content if isinstance(content, list) else []
        for block in blocks:
            if block.get("type") == "tool_result":
                messages.append({"role": "tool", "content": _text(block.get("content"))})
        texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
        if role == "user" and len(texts) > 1:
            # Each text block its own utterance: the last is what is answered (the
            # gateway's recalled excerpts come in a block before the new message).
            messages += [{"role": role, "content": text} for text in texts]
            continue
        text = _text(content)
        if text or not any(b.get("type") == "tool_result" for b in blocks):
            messages.append({"role": role, "content": text})
    spoken = [i for i, m in enumerate(messages) if m["role"] != "system"]
    if spoken and spoken[-1] != len(messages) - 1:
        messages.append(messages.pop(spoken[-1]))
    return messages


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


@dataclass
class FakeAnthropic:
    """The Messages API's state: the prompt cache (``cache.min_tokens`` sets its minimum
    cacheable prefix; ``cache.clear()`` forgets it) and the streams that reached
    ``message_stop``."""

    cache: PromptCache = field(default_factory=PromptCache)
    completed_streams: int = 0
    # By model name: (media type, body) answered as they are (the module's docstring).
    scripted: dict[str, tuple[str, bytes]] = field(default_factory=dict)

    def respond(
        self,
        path: str,
        headers: Mapping[str, str],
        raw: bytes,
        reply: Reply,
        rejected_keys: Collection[str] = (),
    ) -> Response:
        """The answer to one request of ``/v1/messages`` or its ``/count_tokens``."""
        refused = header_refusal(headers)
        key = api_key(headers)
        if refused is None and key in rejected_keys:
            refused = Refusal(401, "authentication_error", "invalid x-api-key")
        if refused is not None:
            return error_response(refused)
        try:
            body = json.loads(raw)
        except ValueError:
            return error_response(
                Refusal(400, "invalid_request_error", "The request body is not valid JSON")
            )
        count_only = path.endswith("/count_tokens")
        refused = refusal(headers, body, count_only=count_only)
        if refused is not None:
            return error_response(refused)
        if count_only:
            usage = self.cache.usage(key, body, write=False)
            total = sum(
                usage[k]
                for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
            )
            return JSONResponse({"input_tokens": total}, headers={"request-id": _request_id()})
        model = body["model"]
        if model in self.scripted:
            media_type, content = self.scripted[model]
            return Response(content, media_type=media_type, headers={"request-id": _request_id()})
        if model in _ERRORS:
            retry = {"retry-after": "7"} if model == "rate-limit" else None
            return error_response(_ERRORS[model], retry)
        message = self._message(key, body, reply)
        headers_out = {"request-id": _request_id()}
        if not body.get("stream"):
            return JSONResponse(message, headers=headers_out)
        return StreamingResponse(
            self._events(message, model), media_type="text/event-stream", headers=headers_out
        )

    def _message(self, key: str, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        model = body["model"]
        answer, calls = reply(
            as_messages(body), "tool-caller" if model == "tool-caller" else "fake-model"
        )
        content: list[dict[str, Any]] = []
        if body["max_tokens"] == 0:  # a request that only fills the prompt cache
            answer, calls = None, None
        thinking = (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")
        if model == "thinker" and thinking and answer is not None:
            content.append(
                {"type": "thinking", "thinking": THOUGHT, "signature": signature(THOUGHT)}
            )
        if answer is not None:
            content.append({"type": "text", "text": answer})
        for call in calls or ():
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{secrets.token_hex(12)}",
                    "name": call["function"]["name"],
                    "input": json.loads(call["function"]["arguments"]),
                }
            )
        cut = model == "cut-short" or not content
        stop = "tool_use" if calls else "max_tokens" if cut else "end_turn"
        usage = self.cache.usage(key, body)
        usage["output_tokens"] = sum(block_tokens(block) for block in content)
        usage["service_tier"] = "standard"
        return {
            "id": f"msg_{secrets.token_hex(12)}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }

    async def _events(self, message: dict[str, Any], model: str) -> AsyncIterator[bytes]:
        """The message as Anthropic streams it."""
        delay = 0.3 if model == "slow-stream" else 0.0
        usage = message["usage"]
        started = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {**usage, "output_tokens": 1},
        }
        yield _event("message_start", {"message": started})
        for index, block in enumerate(message["content"]):
            yield _event("content_block_start", {"index": index, "content_block": _opened(block)})
            if index == 0:
                yield _event("ping", {})
            for delta in _deltas(block):
                yield _event("content_block_delta", {"index": index, "delta": delta})
                if model == "fail-stream" and delta["type"] == "text_delta":
                    error = {"type": "overloaded_error", "message": "Overloaded"}
                    yield _event("error", {"error": error})
                    return
                if delay:
                    await asyncio.sleep(delay)
            yield _event("content_block_stop", {"index": index})
        delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
        yield _event(
            "message_delta", {"delta": delta, "usage": {"output_tokens": usage["output_tokens"]}}
        )
        yield _event("message_stop", {})
        self.completed_streams += 1


def _opened(block: dict[str, Any]) -> dict[str, Any]:
    """A content block as ``content_block_start`` gives it: without its content."""
    if block["type"] == "text":
        return {"type": "text", "text": ""}
    if block["type"] == "thinking":
        return {"type": "thinking", "thinking": "", "signature": ""}
    return {**block, "input": {}}


def _deltas(block: dict[str, Any]) -> list[dict[str, Any]]:
    """A content block's deltas: its text word by word, its thinking and then its
    signature, its input's JSON in two halves."""
    if block["type"] == "text":
        words = block["text"].split(" ")
        return [
            {"type": "text_delta", "text": w if n == 0 else " " + w} for n, w in enumerate(words)
        ]
    if block["type"] == "thinking":
        return [
            {"type": "thinking_delta", "thinking": block["thinking"]},
            {"type": "signature_delta", "signature": block["signature"]},
        ]
    arguments = json.dumps(block["input"])
    half = len(arguments) // 2
    return [
        {"type": "input_json_delta", "partial_json": part}
        for part in (arguments[:half], arguments[half:])
    ]
