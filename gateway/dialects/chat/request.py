"""Validation of a chat-completions request body (pure).

Only what the gateway relies on is checked; every other field is forwarded untouched.
Errors name the offending field the way OpenAI does (``messages.2.role``).

What is checked is what memory keeps: a message that passes here may be stored and sent
again on every later turn, so a shape the upstream would refuse (a content part whose
``text`` is a number, a tool result answering no call) must be refused now, not replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

import numpy as np
import pydantic_core
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from gateway import codec, offload
from gateway.dialects.chat.parts import chat_shaped
from gateway.dialects.tool_names import check_chat_tools, name_error, recorded_bad_name
from gateway.errors import InvalidRequest, PayloadTooLarge
from gateway.memory import images as media
from gateway.memory.model import PROMPT_ROLES, Message, call_texts

# Longer than any model name or path a server uses; keeps a fuzzed megabyte out of logs.
MAX_MODEL_LENGTH = 1024

# Content-part fields the gateway reads (token counting, recall, summaries), with the
# type each must have; other fields and part types are forwarded as they are.
_PART_FIELDS: dict[str, type] = {"type": str, "text": str, "refusal": str, "image_url": dict}

# A message's content as the OpenAPI document describes it (``_check_part`` checks it).
Content = Annotated[Any, WithJsonSchema({
    "description": "a string, an array of content parts, or null",
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "object", "properties": {
            "type": {"type": "string"}, "text": {"type": "string"},
            "refusal": {"type": "string"},
            "image_url": {"type": "object", "properties": {"url": {"type": "string"}}},
        }}},
        {"type": "null"},
    ],
})]  # fmt: skip


def _check_part(part: Any) -> None:
    if not isinstance(part, dict):
        raise ValueError("content parts must be objects")
    for field, kind in _PART_FIELDS.items():
        if field in part and not isinstance(part[field], kind):
            raise ValueError(f"content part field {field!r} must be a {kind.__name__}")
    if "image_url" in part and not isinstance(part["image_url"].get("url", ""), str):
        raise ValueError("content part field 'image_url.url' must be a str")


class _FunctionShape(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: StrictStr
    arguments: StrictStr


class _ToolCallShape(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: StrictStr = Field(min_length=1)
    type: StrictStr
    function: _FunctionShape | None = None


def _field_error(model: str, field: str, message: str) -> ValidationError:
    """An error a model validator places at one of its fields: its own would name the
    whole message (``messages.2``) where the problem is the field (``messages.2.content``).
    Typed ``missing`` so that ``_param`` names the field even where the client left it out.
    """
    problem = InitErrorDetails(
        type=PydanticCustomError("missing", message), loc=(field,), input=None
    )
    return ValidationError.from_exception_data(model, [problem])


class MessageShape(BaseModel):
    """One message as the gateway may store it (the chat proxy and the memory API's import)."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    # Checked by hand: a pydantic union would name its members in the error's location
    # ("messages.0.content.str") where OpenAI names the field ("messages.0.content").
    content: Content = None
    tool_calls: list[_ToolCallShape] | None = None
    tool_call_id: StrictStr | None = None
    name: StrictStr | None = None
    # A refused answer as OpenAI's SDK keeps it, beside content null: stored as a refusal
    # part of an assistant's content (``Message.from_openai``).
    refusal: StrictStr | None = None

    @model_validator(mode="after")
    def _check_assistant_says_something(self) -> MessageShape:
        # An assistant message with nothing in it would be stored and sent again on every
        # later turn, and OpenAI refuses one (content is required without tool_calls):
        # every later turn of the session would fail.
        if (
            self.role == "assistant"
            and self.content is None
            and not self.tool_calls
            and self.refusal is None
        ):
            raise _field_error(
                type(self).__name__,
                "content",
                "required for assistant messages without tool_calls or a refusal",
            )
        return self

    @field_validator("content")
    @classmethod
    def _check_content(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError("must be a string, an array of content parts, or null")
        for part in value:
            _check_part(part)
        return value


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


class ChatCompletionRequest(BaseModel):
    """A chat-completions body as far as the gateway reads it (the rest is forwarded)."""

    model_config = ConfigDict(extra="allow")
    # Strict: "yes" is not a boolean, 5 is not a model name (pydantic would coerce them).
    model: StrictStr = Field(min_length=1, max_length=MAX_MODEL_LENGTH)
    messages: list[MessageShape]
    stream: StrictBool | None = None
    stream_options: _StreamOptions | None = None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    body: dict[str, Any]  # the client's JSON, forwarded with only `messages` replaced
    model: str
    messages: tuple[Message, ...]
    stream: bool

    def forwarded(
        self, context: Sequence[dict[str, Any]], resolved: frozenset[str] = frozenset()
    ) -> bytes:
        """The body to send upstream: the client's, with ``context`` as its messages
        (chat has no item references: ``resolved`` is always empty)."""
        return codec.dumps({**self.body, "messages": chat_shaped(context)})

    def check_recorded(self, recorded: Sequence[Message]) -> None:
        """Refuse (400) a function name memory would keep in ``recorded``, the end of
        ``messages`` that a turn stores (``tool_names``)."""
        bad = recorded_bad_name(self.messages, recorded)
        if bad is not None:
            raise name_error(chat_field(bad.position, bad.path), bad.name)


class MessageLimits(Protocol):
    """Caps on what one request may hold, below the body's: ``ServerConfig`` is one
    (``server.max_messages``, ``server.max_message_bytes``)."""

    @property
    def max_messages(self) -> int: ...

    @property
    def max_message_bytes(self) -> int: ...

    @property
    def max_media_bytes(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Limits:
    """``MessageLimits`` with the config's defaults."""

    max_messages: int = 2048
    max_message_bytes: int = 1024 * 1024
    max_media_bytes: int = 20 * 1024 * 1024


DEFAULT_LIMITS = Limits()


def check_kept_shape(message: dict[str, Any], param: str) -> None:
    """Refuse (400, at ``param``) a message another API's request would have memory keep
    in a shape the chat proxy refuses: kept, it may be sent again, through any of the
    APIs, on every later turn."""
    try:
        MessageShape.model_validate(message)
    except ValidationError as error:
        problem = str(error.errors()[0]["msg"]).removeprefix("Value error, ")
        raise InvalidRequest(f"{param}: {problem}", param=param) from None


def model_and_stream(body: dict[str, Any]) -> tuple[str, bool]:
    """A body's ``model`` and ``stream`` (400 naming the field), for the APIs whose body
    is not a pydantic model here (Responses, Messages)."""
    model = body.get("model")
    if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_LENGTH:
        raise InvalidRequest(
            f"model: must be a string of 1 to {MAX_MODEL_LENGTH} characters", param="model"
        )
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("stream: must be a boolean", param="stream")
    return model, bool(stream)


def check_message_count(messages: Any, limits: MessageLimits) -> None:
    """Refuse more than ``max_messages`` messages (400), before any is validated: a
    hundred thousand tiny messages cost more to check than one large one."""
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        raise InvalidRequest(
            f"messages: {len(messages)} messages, more than the {limits.max_messages} "
            "one request may hold",
            param="messages",
            code="too_many_messages",
        )


# Every message has a "role" key; elsewhere the bytes "role" (quotes included) appear
# only as a string that is that word or ends in an escaped quote and it, or another
# object's key: rare. A body holding them several times more often than messages may be
# sent is refused before it is parsed. Parsing builds every object holding the GIL
# (100,000 tiny messages: ~40 ms the event loop could not run). Counting the token takes
# ~2 ms of GIL on a 3.4 MB body, so it is counted only when the body's quotes leave room
# for that many: a body of long strings (images) has few quotes, and numpy counts them
# in ~0.4 ms, comparing without the GIL.
_ROLE = b'"role"'
_ROLE_MARGIN = 4
_QUOTE = ord('"')


def check_raw_message_count(raw: bytes, limits: MessageLimits) -> None:
    """Refuse, before parsing, a body with far more messages than ``max_messages``."""
    most = _ROLE_MARGIN * limits.max_messages
    if len(raw) <= len(_ROLE) * most:
        return
    quotes = int(np.count_nonzero(np.frombuffer(raw, np.uint8) == _QUOTE))
    if quotes // 2 > most and raw.count(_ROLE) > most:
        raise InvalidRequest(
            f"messages: more than the {limits.max_messages} messages one request may hold",
            param="messages",
            code="too_many_messages",
        )


def _utf8_over(texts: Sequence[str], limit: int) -> bool:
    """Whether the texts take more than ``limit`` bytes in UTF-8 (encoded only when their
    length in characters leaves it open: a character takes one to four bytes)."""
    chars = sum(map(len, texts))
    if chars > limit:
        return True
    if 4 * chars <= limit:
        return False
    return sum(len(text.encode()) for text in texts) > limit


def _content_texts(content: Any) -> list[str]:
    """What a message's content takes against ``max_message_bytes``: its text parts'
    text, and every other part but an image (capped apart) whole, as JSON: an audio
    clip, a file's data, a part of a type the gateway does not know are stored and sent
    again like text (20 MiB of ``input_audio`` went into every later turn)."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    texts = []
    for part in content:
        if not isinstance(part, dict) or media.is_image(part):
            continue
        kind = part.get("type")
        if kind in ("text", "refusal") and isinstance(part.get(kind), str):
            texts.append(part[kind])
        else:
            texts.append(codec.dumps(part).decode("utf-8", "replace"))
    return texts


def chat_field(i: int, path: str) -> str:
    """A message's field as a chat-completions client names it: ``messages.2.content``."""
    return f"messages.{i}.{path}"


# Where a field of a checked message is, in the client's own terms (the Responses API
# names the input item a message came from).
FieldName = Callable[[int, str], str]


def _check_media_sizes(i: int, content: list[Any], limit: int, where: FieldName) -> None:
    """Refuse an image whose URL is neither http(s) nor data (400), or whose data URL
    holds more than ``limit`` bytes (413): its bytes are not text, and are capped apart
    from it (``max_media_bytes``)."""
    for j, part in enumerate(content):
        if not media.is_image(part):
            continue
        url = media.image_url(part)
        param = where(i, f"content.{j}.image_url.url")
        if not media.is_acceptable_url(url):
            # A file:, gopher: or internal URL would be stored and sent upstream again
            # on every turn: an upstream that fetches image URLs would fetch it.
            raise InvalidRequest(
                f"{param}: an image URL must be http://, https:// or a data: URL",
                param=param,
                code="invalid_image",
            )
        if not media.is_data_url(url) and media.names_private_host(url):
            raise InvalidRequest(
                f"{param}: an image URL must not name a loopback or private address",
                param=param,
                code="invalid_image",
            )
        if media.is_data_url(url) and media.encoded_size(url) > limit:
            raise PayloadTooLarge(
                f"{param}: the image is larger than the {limit}-byte limit on one image",
                param=param,
            )


def check_message_sizes(
    messages: Sequence[Any], limits: MessageLimits, where: FieldName = chat_field
) -> None:
    """Refuse a message whose text (what is tokenized and indexed: its content, and its
    tool calls' names and arguments) is over ``max_message_bytes``, or one of whose
    images is over ``max_media_bytes`` (413), or has a URL no upstream should fetch (400).
    ``where`` names the offending field."""
    limit = limits.max_message_bytes
    quarter = limit // 4
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        text = message.get("content")
        if isinstance(text, list):
            _check_media_sizes(i, text, limits.max_media_bytes, where)
        refusal = message.get("refusal")
        if (
            isinstance(text, str)
            and len(text) <= quarter
            and not message.get("tool_calls")
            and not refusal
        ):
            continue  # (nearly every message: far below the cap in any encoding)
        content = _content_texts(text)
        if isinstance(refusal, str):
            content.append(refusal)  # stored as a refusal part of the content
        calls = call_texts(message.get("tool_calls"))
        if _utf8_over(content, limit):
            param = where(i, "content")
        elif calls and _utf8_over(content + calls, limit):
            param = where(i, "tool_calls")
        else:
            continue
        raise PayloadTooLarge(
            f"{param}: the message is larger than the {limit}-byte limit on one message",
            param=param,
        )


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


def parse_json(raw: bytes) -> Any:
    """Strict JSON: UTF-8 only, no NaN, at most 200 levels deep, no lone surrogates.

    Python's ``json`` takes all of these, and each one fails later, where it is a 500:
    10,000 nested arrays overflow the stack, a lone surrogate cannot be encoded again
    (not for the upstream, not for Redis), NaN is not JSON to the upstream.
    """
    try:
        return pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as error:
        raise InvalidRequest(
            f"request body is not valid JSON: {error}", code="invalid_json"
        ) from None


def validation_error(body: Any, error: ValidationError, prefix: str = "") -> InvalidRequest:
    """The first problem pydantic found, named by its path in the client's JSON."""
    first = error.errors()[0]
    param = prefix + _param(body, first)
    # A validator's own message, without pydantic's "Value error, " before it.
    message = str(first["msg"]).removeprefix("Value error, ")
    return InvalidRequest(f"{param or 'body'}: {message}", param=param or None)


def open_tool_calls(messages: Sequence[Message]) -> frozenset[str]:
    """The ids of the tool calls a tool message may answer after ``messages``."""
    open_ids: frozenset[str] = frozenset()
    for message in messages:
        if message.role == "assistant":
            open_ids = frozenset(str(call["id"]) for call in message.tool_calls or ())
        elif message.role not in PROMPT_ROLES and message.role != "tool":
            open_ids = frozenset()
    return open_ids


def _orphan(messages: Sequence[Message], open_ids: frozenset[str] | None) -> int | None:
    """Position of the first tool message that answers no open call; None if all do."""
    for i, message in enumerate(messages):
        if message.role == "tool":
            if message.tool_call_id is None:
                return i
            if open_ids is not None and message.tool_call_id not in open_ids:
                return i
        elif message.role not in PROMPT_ROLES:
            open_ids = open_tool_calls([message])
    return None


def _orphan_error(message: Message, position: int) -> InvalidRequest:
    param = f"messages.{position}.tool_call_id"
    if message.tool_call_id is None:
        return InvalidRequest(f"{param}: required for tool messages", param=param)
    return InvalidRequest(
        f"{param}: {message.tool_call_id!r} answers no tool call of the assistant message "
        "before it",
        param=param,
    )


def check_tool_results(messages: Sequence[Message], stored: Sequence[Message] | None) -> None:
    """Every tool message answers a call of the assistant message it follows.

    ``stored`` is the end of the session's log, which tool results leading ``messages``
    answer (an import that continues a session); None where it is not known: those are
    then left for ``check_turn_tool_results``.
    """
    position = _orphan(messages, None if stored is None else open_tool_calls(stored))
    if position is not None:
        raise _orphan_error(messages[position], position)


def check_turn_tool_results(
    messages: Sequence[Message], new: Sequence[Message], prior: Sequence[Message]
) -> None:
    """The turn's new messages, recorded after ``prior``, answer calls made there.

    A request can be consistent in itself and still not continue the stored log: tool
    results sent alone after the call's answer, or a history that branched from the
    store (the store wins, only the new messages are kept). Recorded, such a result would
    be an orphan forwarded on every later turn, which OpenAI refuses; forwarded now it
    is refused already.
    """
    position = _orphan(new, open_tool_calls(prior))
    if position is not None:
        # ``new`` is the end of the request's conversation (prompt roles aside).
        conversation = [i for i, m in enumerate(messages) if m.role not in PROMPT_ROLES]
        offset = len(conversation) - len(new)
        at = conversation[offset + position] if offset >= 0 else position
        raise _orphan_error(new[position], at)


# A tool call's place in a request: (message position, call position, call id).
CallAt = tuple[int, int, str]


def _call_param(at: CallAt) -> str:
    return f"messages.{at[0]}.tool_calls.{at[1]}"


def _calls_of(position: int, message: Message) -> list[CallAt]:
    return [(position, j, str(call["id"])) for j, call in enumerate(message.tool_calls or ())]


def _repeated_call(messages: Sequence[Message]) -> tuple[CallAt, CallAt] | None:
    """The first call whose id an earlier call of the request has, and that call."""
    first_use: dict[str, CallAt] = {}
    for i, message in enumerate(messages):
        for at in _calls_of(i, message):
            if at[2] in first_use:
                return first_use[at[2]], at
            first_use[at[2]] = at
    return None


def _unanswered_call(messages: Sequence[Message]) -> CallAt | None:
    """The first call no tool message answers before the next non-prompt, non-tool
    message (the window ``_orphan`` lets a tool message answer in)."""
    waiting: list[CallAt] = []
    for i, message in enumerate(messages):
        if message.role == "tool":
            waiting = [at for at in waiting if at[2] != message.tool_call_id]
        elif message.role not in PROMPT_ROLES:
            if waiting:
                return waiting[0]
            waiting = _calls_of(i, message)
    return waiting[0] if waiting else None


def check_tool_calls(messages: Sequence[Message]) -> None:
    """Every tool call of the request is answered in it, and has an id of its own.

    Stored, an unanswered or repeated call would be sent again on every later turn, and
    OpenAI refuses such a history ("No tool output found for function call ..."). Calls
    memory holds are not in the request: a client answering one sends only the tool
    message, which ``check_turn_tool_results`` matches to the stored call.
    """
    repeated = _repeated_call(messages)
    if repeated is not None:
        first, again = repeated
        param = _call_param(again)
        raise InvalidRequest(
            f"{param}: tool call id {again[2]!r} is already the id of {_call_param(first)}",
            param=param,
        )
    unanswered = _unanswered_call(messages)
    if unanswered is not None:
        param = _call_param(unanswered)
        raise InvalidRequest(
            f"{param}: tool call {unanswered[2]!r} has no tool message answering it before "
            "the next user or assistant message",
            param=param,
        )


async def parse_chat_request_off_loop(raw: bytes, limits: MessageLimits) -> ChatRequest:
    """``parse_chat_request``, in the heavy-work pool when the body is large."""
    return await offload.sized(len(raw), parse_chat_request, raw, limits)


def parse_chat_request(raw: bytes, limits: MessageLimits = DEFAULT_LIMITS) -> ChatRequest:
    check_raw_message_count(raw, limits)
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object", code="invalid_json")
    check_message_count(body.get("messages"), limits)
    try:
        shape = ChatCompletionRequest.model_validate(body)
    except ValidationError as error:
        raise validation_error(body, error) from None
    if not shape.messages:
        raise InvalidRequest("messages must not be empty", param="messages")
    check_message_sizes(body["messages"], limits)
    messages = tuple(Message.from_openai(m) for m in body["messages"])
    for i, message in enumerate(messages):
        if message.role == "function" and message.name is None:
            # The legacy function result: stored, it must say whose result it is.
            raise InvalidRequest(
                f"messages.{i}.name: required for function messages", param=f"messages.{i}.name"
            )
    check_tool_results(messages, None)
    check_tool_calls(messages)
    check_chat_tools(body)
    return ChatRequest(body=body, model=shape.model, messages=messages, stream=bool(shape.stream))
