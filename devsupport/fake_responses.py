"""The fake upstream's ``POST /v1/responses``: the Responses API's shapes, streamed or not.

The answer comes from the request's context exactly as the chat fake's does (``reply_to``
over ``instructions`` and the ``input`` items read as messages), so a memory test passes
only if the gateway really forwarded the remembered message. Models:

    fake-model    answers from its context
    tool-caller   calls get_weather, then answers from the function_call_output
    slow-stream   text deltas 0.3 s apart
    error-500     500 with an OpenAI error body, streamed or not
    fail-stream   the stream ends with response.failed (no response.completed)
    cut-short     answers as fake-model, but ``incomplete`` (max_output_tokens), streamed
                  (``response.incomplete``) or not
    cached-prompt answers as fake-model; its usage says CACHED_TOKENS of the input came
                  from the prompt cache (the others say 0)

Output items get fresh ids (``msg_…``, ``fc_…``), and unless a request says ``store:
false`` its output items are kept (``StoredItems``): an ``item_reference`` to one is
read as that item, one to an id never kept is refused with OpenAI's 404.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import JSONResponse, Response


def as_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as chat-like messages (what ``reply_to`` reads)."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in items or ():
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item["role"], "content": item.get("content")})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": item.get("output")})
        elif kind == "function_call":
            messages.append({"role": "assistant", "content": None})
    return messages


# What ``cached-prompt`` reports as served from its prompt cache (of 10 input tokens).
CACHED_TOKENS = 6


def _usage(model: Any) -> dict[str, Any]:
    return {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": CACHED_TOKENS if model == "cached-prompt" else 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }


def response_object(
    response_id: str, body: dict[str, Any], output: list[dict[str, Any]], status: str
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": body.get("model", "fake-model"),
        "output": output,
        "instructions": body.get("instructions"),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": body.get("tools") or [],
        "temperature": 1.0,
        "top_p": 1.0,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "metadata": {},
        "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store", True),
        "usage": _usage(body.get("model")) if status == "completed" else None,
    }


def _final_status(body: dict[str, Any]) -> str:
    return "incomplete" if body.get("model") == "cut-short" else "completed"


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": [part] if status == "completed" else [],
    }


def _call_item(item_id: str, call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call["id"],
        "status": status,
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"] if status == "completed" else "",
    }


def output_items(answer: str | None, calls: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A response's output items, completed, each with an id of its own."""
    output = [_call_item(f"fc_{secrets.token_hex(8)}", call) for call in calls or ()]
    if answer is not None:
        output.insert(0, _message_item(f"msg_{secrets.token_hex(8)}", answer))
    return output


class StoredItems:
    """The output items of the responses a request did not ask not to store (``store``
    is true by default), as OpenAI keeps them for ``item_reference``."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}

    def keep(self, body: dict[str, Any], output: list[dict[str, Any]]) -> None:
        if body.get("store") is not False:
            self.items.update((item["id"], item) for item in output)

    def resolve(self, body: dict[str, Any]) -> dict[str, Any] | Response:
        """``body`` with each item reference replaced by the item it names; a 404 in
        OpenAI's envelope for an id never kept."""
        items = body.get("input")
        if not isinstance(items, list):
            return body
        resolved = []
        for item in items:
            if isinstance(item, dict) and item.get("type") == "item_reference":
                kept = self.items.get(item.get("id"))  # type: ignore[arg-type]
                if kept is None:
                    error = {"message": f"Item with id '{item.get('id')}' not found.",
                             "type": "invalid_request_error", "param": "input",
                             "code": None}  # fmt: skip
                    return JSONResponse({"error": error}, status_code=404)
                item = kept
            resolved.append(item)
        return {**body, "input": resolved}


def refusal(body: dict[str, Any], messages: list[dict[str, Any]]) -> Response | None:
    """The error answers: a model that fails, an input with nothing to answer, a
    ``function_call`` without its ``function_call_output`` (as OpenAI refuses it)."""
    if body.get("model") == "error-500":
        error = {"message": "upstream exploded", "type": "server_error", "param": None,
                 "code": None}  # fmt: skip
        return JSONResponse({"error": error}, status_code=500)
    if not messages:
        error = {"message": "input: nothing to answer", "type": "invalid_request_error",
                 "param": "input", "code": None}  # fmt: skip
        return JSONResponse({"error": error}, status_code=400)
    items = body.get("input") if isinstance(body.get("input"), list) else []
    answered = {i.get("call_id") for i in items if i.get("type") == "function_call_output"}
    for item in items:
        if item.get("type") == "function_call" and item.get("call_id") not in answered:
            error = {"message": f"No tool output found for function call {item.get('call_id')}.",
                     "type": "invalid_request_error", "param": "input", "code": None}  # fmt: skip
            return JSONResponse({"error": error}, status_code=400)
    return None


def complete(response_id: str, body: dict[str, Any], output: list[dict[str, Any]]) -> Response:
    return JSONResponse(response_object(response_id, body, output, _final_status(body)))


def _event(kind: str, number: int, **fields: Any) -> bytes:
    data = {"type": kind, "sequence_number": number, **fields}
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


async def stream_events(
    response_id: str,
    body: dict[str, Any],
    output: list[dict[str, Any]],
    finished: Callable[[], None],
) -> AsyncIterator[bytes]:
    """The event stream of one response (its ``output_items``), as the OpenAI API sends
    it."""
    model = body.get("model", "fake-model")
    numbers = iter(range(1_000_000))
    delay = 0.3 if model == "slow-stream" else 0.0

    def event(kind: str, **fields: Any) -> bytes:
        return _event(kind, next(numbers), **fields)

    yield event("response.created", response=response_object(response_id, body, [], "in_progress"))
    if model == "malformed-sse":  # one event whose data is not JSON, the rest as usual
        yield b"event: response.in_progress\ndata: {not json\n\n"
    yield event(
        "response.in_progress", response=response_object(response_id, body, [], "in_progress")
    )
    for index, done in enumerate(output):
        item_id = done["id"]
        if done["type"] == "message":
            answer = done["content"][0]["text"]
            yield event(
                "response.output_item.added",
                output_index=index,
                item=_message_item(item_id, "", "in_progress"),
            )
            place = {"item_id": item_id, "output_index": index, "content_index": 0}
            empty = {"type": "output_text", "text": "", "annotations": []}
            yield event("response.content_part.added", **place, part=empty)
            for n, word in enumerate(answer.split(" ")):
                yield event(
                    "response.output_text.delta",
                    **place,
                    delta=word if n == 0 else " " + word,
                    logprobs=[],
                )
                if delay:
                    await asyncio.sleep(delay)
            yield event("response.output_text.done", **place, text=answer, logprobs=[])
            yield event(
                "response.content_part.done",
                **place,
                part={"type": "output_text", "text": answer, "annotations": []},
            )
        else:
            call = {"id": done["call_id"], "function": {"name": done["name"], "arguments": ""}}
            yield event(
                "response.output_item.added",
                output_index=index,
                item=_call_item(item_id, call, "in_progress"),
            )
            arguments = done["arguments"]
            for piece in (arguments[: len(arguments) // 2], arguments[len(arguments) // 2 :]):
                yield event(
                    "response.function_call_arguments.delta",
                    item_id=item_id,
                    output_index=index,
                    delta=piece,
                )
            yield event(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=index,
                arguments=arguments,
                name=done["name"],
            )
        yield event("response.output_item.done", output_index=index, item=done)
    if model == "fail-stream":
        failed = response_object(response_id, body, output, "failed")
        failed["error"] = {"code": "server_error", "message": "the model failed"}
        yield event("response.failed", response=failed)
    else:
        status = _final_status(body)
        final = response_object(response_id, body, output, status)
        yield event(f"response.{status}", response=final)
    finished()
