"""The Responses API served over a chat-completions upstream (pure; ``upstream.responses``).

llama-cpp-python, Ollama and many vLLM deployments have no ``/v1/responses``. For them the
gateway speaks the Responses API itself: the request's context (memory's chat-format
messages) goes to ``/chat/completions`` (``chat_body``), and the answer comes back in the
Responses API's shapes, whole (``response_from_completion``) or as its typed events
(``EventsFromChat``, fed the chat stream chunk by chunk). The answer is then read by the
Responses dialect as any upstream's would be: recorded from ``response.completed``,
which reaches the client only once the turn is stored.

Only function tools have a chat form: a request with a built-in tool (web search, file
search...) is refused (400), as the upstream could not run it. A chat answer cut short
(``finish_reason: length``) is an ``incomplete`` response, as the Responses API reports it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from gateway import codec
from gateway.dialects.chat.parts import chat_shaped
from gateway.dialects.responses.watch import error_event
from gateway.errors import InvalidRequest
from gateway.upstream.sse import SSEDecoder

IdMaker = Callable[[str], str]

# Request fields the response object echoes (as the Responses API does), with their
# defaults when the request leaves them out.
_ECHOED: dict[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "store": True,
    "temperature": None,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": None,
    "truncation": "disabled",
    "user": None,
}
# Chat's reasons an answer stopped short, as a Responses ``incomplete_details.reason``.
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


# -- the request ------------------------------------------------------------------------


def _chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses' flat function tools as chat's nested ones; a built-in tool refused."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise InvalidRequest(
                f"tools.{i}: a {kind!r} tool needs an upstream with the Responses API; this "
                "one serves chat completions only (upstream.responses), so only function "
                "tools can be given",
                param=f"tools.{i}.type",
                code="unsupported_tool",
            )
        function = {"name": tool.get("name")}
        for field in ("description", "parameters", "strict"):
            if tool.get(field) is not None:
                function[field] = tool[field]
        out.append({"type": "function", "function": function})
    return out


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, str) or choice is None:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise InvalidRequest(
        "tool_choice: only 'auto', 'none', 'required' or a function can be served over a "
        "chat-completions upstream (upstream.responses)",
        param="tool_choice",
        code="unsupported_tool_choice",
    )


def _response_format(text: Any) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (None: plain text)."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": fmt["type"]}


def _chat_messages(instructions: Any, context: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The context as a chat upstream takes it: ``instructions`` as the system message
    (joined to the context's own, if it starts with one: many local chat templates take
    one system message, first), ``developer`` as ``system``, and no reference memory
    could not resolve (an assistant message without content or calls: nothing to send).
    Each message's content is shaped as the chat route shapes it (``chat.parts.chat_shaped``:
    text parts alone as one string, a part chat does not take as a short text)."""
    kept = []
    for message in context:
        unresolved = message.get("content") is None and not message.get("tool_calls")
        if message.get("role") == "assistant" and unresolved:
            continue
        if message.get("role") == "developer":
            message = {**message, "role": "system"}
        kept.append(message)
    messages = chat_shaped(kept)
    if isinstance(instructions, str) and instructions:
        first = messages[0] if messages else None
        if first is not None and first["role"] == "system" and isinstance(first["content"], str):
            messages[0] = {**first, "content": instructions + "\n\n" + first["content"]}
        else:
            messages.insert(0, {"role": "system", "content": instructions})
    return messages


def chat_body(body: dict[str, Any], context: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The chat-completions request serving the Responses request ``body`` with ``context``
    (memory's assembled messages) as its conversation."""
    chat: dict[str, Any] = {
        "model": body.get("model"),
        "messages": _chat_messages(body.get("instructions"), context),
    }
    tools = _chat_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
        if body.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    if body.get("tool_choice") is not None and tools:
        chat["tool_choice"] = _chat_tool_choice(body["tool_choice"])
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for field in ("temperature", "top_p", "user"):
        if body.get(field) is not None:
            chat[field] = body[field]
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # the completed event's usage
    return chat


# -- the answer -------------------------------------------------------------------------


def responses_usage(usage: Any) -> dict[str, Any] | None:
    """A chat ``usage`` in Responses terms."""
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    details = usage.get("prompt_tokens_details") or {}
    cached, written = details.get("cached_tokens") or 0, details.get("cache_write_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage.get("total_tokens") or prompt + completion,
    }


def _response(
    request: dict[str, Any], response_id: str, created_at: int, model: Any
) -> dict[str, Any]:
    """A response object before its answer: ``in_progress``, the request's fields echoed."""
    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "model": model if isinstance(model, str) else request.get("model"),
        "output": [],
        "usage": None,
    }
    for field, default in _ECHOED.items():
        value = request.get(field)
        response[field] = default if value is None else value
    return response


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def _finish(response: dict[str, Any], finish_reason: Any) -> None:
    reason = _INCOMPLETE.get(finish_reason) if isinstance(finish_reason, str) else None
    response["status"] = "completed" if reason is None else "incomplete"
    response["incomplete_details"] = None if reason is None else {"reason": reason}


def response_from_completion(
    completion: Any,
    request: dict[str, Any],
    *,
    ids: IdMaker = new_id,
    created_at: int = 0,
) -> dict[str, Any]:
    """A whole chat completion as a Responses ``response``: ``failed`` when it holds no
    finished answer (the dialect records only a ``completed`` one)."""
    body = completion if isinstance(completion, dict) else {}
    created = body.get("created")
    response = _response(
        request, ids("resp"), created if isinstance(created, int) else created_at, body.get("model")
    )
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict) or not isinstance(choice, dict):
        response["status"] = "failed"
        response["error"] = {
            "code": "server_error",
            "message": "the upstream's chat completion holds no answer",
        }
        return response
    output: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and (text or not message.get("tool_calls")):
        output.append(_message_item(ids("msg"), text))
    elif isinstance(message.get("refusal"), str):
        item = _message_item(ids("msg"), "")
        item["content"] = [{"type": "refusal", "refusal": message["refusal"]}]
        output.append(item)
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        call_id = call.get("id") or ids("call")
        name, arguments = function.get("name") or "", function.get("arguments") or ""
        output.append(_call_item(ids("fc"), call_id, name, arguments))
    response["output"] = output
    response["usage"] = responses_usage(body.get("usage"))
    _finish(response, choice.get("finish_reason"))
    return response


class _Call:
    """One streamed tool call: its item, and its arguments so far."""

    __slots__ = ("arguments", "call_id", "index", "item_id", "name")

    def __init__(self, index: int, item_id: str, call_id: str, name: str) -> None:
        self.index, self.item_id, self.call_id, self.name = index, item_id, call_id, name
        self.arguments: list[str] = []


class EventsFromChat:
    """A chat-completions stream turned into the Responses API's events, chunk by chunk.

    ``feed`` takes the upstream's bytes and returns the events they make (whole SSE
    events); ``close`` is told the upstream closed the stream cleanly. The events:
    ``response.created`` and ``response.in_progress`` first; an output item per text
    answer (``output_item.added``, ``content_part.added``, ``output_text.delta``...) and
    per function call (``output_item.added``, ``function_call_arguments.delta``...),
    each closed (``….done``) when the answer ends, in the order they were opened; then
    ``response.completed`` (``response.incomplete`` for an answer cut short) with the whole
    response, usage included. An error chunk becomes an ``error`` event, and so does a
    stream that was not all readable in place of its completion: such an answer is not
    recorded. A stream closed before its answer ended gets no last event: the relay then
    ends it with its own error (``upstream_stream_incomplete``).
    """

    def __init__(
        self, request: dict[str, Any], *, ids: IdMaker = new_id, created_at: int = 0
    ) -> None:
        self._ids = ids
        self._response = _response(request, ids("resp"), created_at, None)
        self._decoder = SSEDecoder()
        self._sequence = 0
        self._started = False
        self._over = False
        self._items: list[_Call | str] = []  # in output order: calls, and the message's id
        self._text: list[str] = []
        self._message_id: str | None = None
        self._calls: dict[int, _Call] = {}
        self._finish_reason: Any = None
        self._usage: Any = None
        self._malformed = False

    # -- the events

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + codec.dumps(data) + b"\n\n"

    def _start(self, out: list[bytes]) -> None:
        if not self._started:
            self._started = True
            out.append(self._event("response.created", response=self._response))
            out.append(self._event("response.in_progress", response=self._response))

    def _text_delta(self, delta: str, out: list[bytes]) -> None:
        if self._message_id is None:
            self._message_id = item_id = self._ids("msg")
            index = len(self._items)
            self._items.append(item_id)
            item = _message_item(item_id, "", "in_progress")
            item["content"] = []
            out.append(self._event("response.output_item.added", output_index=index, item=item))
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            )
        self._text.append(delta)
        out.append(
            self._event(
                "response.output_text.delta",
                item_id=self._message_id,
                output_index=self._items.index(self._message_id),
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        )

    def _call_delta(self, fragment: dict[str, Any], out: list[bytes]) -> None:
        index = fragment.get("index", 0)
        function = fragment.get("function") or {}
        call = self._calls.get(index)
        if call is None:
            call_id = fragment.get("id") or self._ids("call")
            call = self._calls[index] = _Call(index, self._ids("fc"), call_id, "")
            call.name = function.get("name") or ""
            self._items.append(call)
            item = _call_item(call.item_id, call.call_id, call.name, "", "in_progress")
            out.append(
                self._event(
                    "response.output_item.added", output_index=len(self._items) - 1, item=item
                )
            )
        elif function.get("name"):
            call.name += function["name"]  # a name in pieces (rare)
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            call.arguments.append(arguments)
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=call.item_id,
                    output_index=self._items.index(call),
                    delta=arguments,
                )
            )

    def _close_items(self, out: list[bytes]) -> list[dict[str, Any]]:
        output = []
        for index, entry in enumerate(self._items):
            if isinstance(entry, str):
                text = "".join(self._text)
                out.append(
                    self._event(
                        "response.output_text.done",
                        item_id=entry,
                        output_index=index,
                        content_index=0,
                        text=text,
                        logprobs=[],
                    )
                )
                part = {"type": "output_text", "text": text, "annotations": []}
                out.append(
                    self._event(
                        "response.content_part.done",
                        item_id=entry,
                        output_index=index,
                        content_index=0,
                        part=part,
                    )
                )
                item = _message_item(entry, text)
            else:
                arguments = "".join(entry.arguments)
                out.append(
                    self._event(
                        "response.function_call_arguments.done",
                        item_id=entry.item_id,
                        output_index=index,
                        name=entry.name,
                        arguments=arguments,
                    )
                )
                item = _call_item(entry.item_id, entry.call_id, entry.name, arguments)
            out.append(self._event("response.output_item.done", output_index=index, item=item))
            output.append(item)
        return output

    def _end(self, out: list[bytes]) -> None:
        """The answer is over: its items closed, then the response's last event."""
        self._over = True
        self._start(out)
        if self._malformed or self._decoder.damaged:
            out.append(
                self._error("the upstream's chat stream was malformed", "upstream_stream_malformed")
            )
            return
        if not self._items:
            self._text_delta("", out)  # an empty answer is still a message (as chat's is)
        response = self._response
        response["output"] = self._close_items(out)
        response["usage"] = responses_usage(self._usage)
        _finish(response, self._finish_reason)
        out.append(self._event(f"response.{response['status']}", response=response))

    def _error(self, message: str, code: str) -> bytes:
        event = error_event(message, code, self._sequence)
        self._sequence += 1
        return event

    # -- the chunks

    def _add(self, data: str, out: list[bytes]) -> None:
        if data.strip() == "[DONE]":
            self._end(out)
            return
        try:
            chunk = codec.loads(data)
        except ValueError:
            self._malformed = True
            return
        if not isinstance(chunk, dict):
            self._malformed = True
            return
        if isinstance(chunk.get("error"), dict):
            error = chunk["error"]
            self._over = True
            self._start(out)
            code = error.get("code")
            out.append(
                self._error(
                    str(error.get("message") or "upstream error"),
                    code if isinstance(code, str) else "upstream_error",
                )
            )
            return
        if isinstance(chunk.get("model"), str):
            self._response["model"] = chunk["model"]
        self._start(out)
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        try:
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict) and choice.get("index", 0) == 0:
                    self._add_choice(choice, out)
        except (AttributeError, TypeError, ValueError):
            self._malformed = True  # a chunk of an unexpected shape: not recorded

    def _add_choice(self, choice: dict[str, Any], out: list[bytes]) -> None:
        delta = choice.get("delta") or {}
        content = delta.get("content")
        if isinstance(content, str) and content:
            self._text_delta(content, out)
        for fragment in delta.get("tool_calls") or ():
            self._call_delta(fragment, out)
        if choice.get("finish_reason"):
            self._finish_reason = choice["finish_reason"]

    def feed(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        for event in self._decoder.feed(chunk):
            if not self._over:
                self._add(event.data, out)
        return b"".join(out)

    def close(self) -> bytes:
        """The upstream closed the stream: an answer that finished (a ``finish_reason``)
        without ``[DONE]`` is ended here; one that did not is left unended."""
        out: list[bytes] = []
        for event in self._decoder.close():
            if not self._over:
                self._add(event.data, out)
        if not self._over and self._finish_reason is not None:
            self._end(out)
        return b"".join(out)
