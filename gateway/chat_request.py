"""Validation of a chat-completions request body (pure).

Only what the gateway relies on is checked; every other field is forwarded untouched.
Errors name the offending field the way OpenAI does (``messages.2.role``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
)
from pydantic_core import ErrorDetails

from gateway.errors import InvalidRequest
from gateway.memory.model import Message


class _MessageShape(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    # Checked by hand: a pydantic union would name its members in the error's location
    # ("messages.0.content.str") where OpenAI names the field ("messages.0.content").
    content: Any = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _check_content(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(part, dict) for part in value):
            return value
        raise ValueError("must be a string, an array of content parts, or null")


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


class _RequestShape(BaseModel):
    model_config = ConfigDict(extra="allow")
    # Strict: "yes" is not a boolean, 5 is not a model name (pydantic would coerce them).
    model: StrictStr
    messages: list[_MessageShape]
    stream: StrictBool | None = None
    stream_options: _StreamOptions | None = None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    body: dict[str, Any]  # the client's JSON, forwarded with only `messages` replaced
    model: str
    messages: tuple[Message, ...]
    stream: bool


def _param(body: Any, error: ErrorDetails) -> str:
    """The dotted path of the offending field in the client's JSON.

    pydantic appends the union branch it tried (``messages.0.content.str``); the path
    stops where the client's document does, except for a missing field, which is named.
    """
    parts: list[str] = []
    node = body
    for part in error["loc"]:
        present = (
            part in node
            if isinstance(node, dict)
            else isinstance(node, list) and isinstance(part, int) and part < len(node)
        )
        if not present:
            if error["type"] == "missing":
                parts.append(str(part))
            break
        node = node[part]
        parts.append(str(part))
    return ".".join(parts)


def parse_chat_request(raw: bytes) -> ChatRequest:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object", code="invalid_json")
    try:
        shape = _RequestShape.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        param = _param(body, first)
        raise InvalidRequest(f"{param}: {first['msg']}", param=param) from None
    if not shape.messages:
        raise InvalidRequest("messages must not be empty", param="messages")
    return ChatRequest(
        body=body,
        model=shape.model,
        messages=tuple(Message.from_openai(m) for m in body["messages"]),
        stream=bool(shape.stream),
    )
