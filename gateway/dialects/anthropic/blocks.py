"""Anthropic Messages content ⇄ chat-format messages (pure).

Memory keeps chat-format ``Message``s whichever API a turn came through. The mapping:

    user message                              →  a user message (its blocks as chat parts)
    system message (a beta's)                 →  a system message: the client's prompt
        text                                  ⇄  text parts
        image (base64 / url source)           ⇄  image_url parts (a data URL / the URL)
        document (base64 PDF)                 ⇄  a file part (``file_data``)
        document (text source)                →  a text part
        tool_result (tool_use_id, content)    ⇄  a tool message (tool_call_id) before it
    assistant message                         →  an assistant message
        text blocks                           ⇄  its content, one string
        tool_use (id, name, input)            ⇄  its tool_calls (arguments: input as JSON)

Notes:
    ``cache_control`` is read by the upstream's cache, not the conversation: it is never
    stored, so a block sent with it and resent without it is the same message. Thinking
    blocks and server tools' blocks have no chat form and are not stored; other block
    types are stored as a short text (``[type]``), never as a payload the gateway does
    not understand. ``system`` is the client's prompt: forwarded as sent, never stored
    (``request``). What the API refuses is refused (400) rather than read some other
    way: an empty message (but a final assistant one), a blank user text, the other
    side's blocks (an assistant's image or tool result, a user's tool call), a tool
    call's input that is not an object. Read anyway, it would vanish from the request
    forwarded (which the upstream then answered) and be stored as it was read.

    Going out (``to_anthropic``), what chat keeps in several messages Anthropic keeps in
    one: consecutive messages of one side are joined (tool results first, as the API
    requires after a tool_use), and a memory message after the conversation began goes
    to the user's side as text (Anthropic's ``system`` is only the top-level field).
    What the other APIs stored goes in a shape Anthropic takes, or a session that mixed
    them would be refused on every later turn: a blank text is left out, a tool call's
    id the API would refuse (``functions.f:0``) is made one it takes (the same for its
    result), a custom tool's call goes with its name, a file as a PDF or text document
    or else as its name.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidRequest
from gateway.memory import images as media
from gateway.memory.model import Message, content_text

ROLES = ("user", "assistant", "system")
# Blocks with no chat form and nothing to remember: the model's own reasoning, and the
# calls and results of tools the upstream runs itself.
NOT_STORED = frozenset(
    {
        "thinking",
        "redacted_thinking",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
    }
)
PROMPT_ROLES = frozenset({"system", "developer"})
# The other side's blocks, which the API refuses in a message of this role.
_NOT_IN = {
    "user": frozenset({"tool_use"}),
    "assistant": frozenset({"tool_result", "image", "document"}),
}
# Said as the first user message when memory's context begins with an answer: Anthropic
# takes a conversation that starts with the user.
CONTINUED = "(The conversation continues from earlier.)"


@dataclass(frozen=True, slots=True)
class Converted:
    """A request's ``messages`` as chat messages; ``origins[n]``: the field of the
    client's message ``messages[n]`` came from (errors name it)."""

    messages: tuple[Message, ...]
    origins: tuple[str, ...]


def _invalid(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param)


def arguments(value: Any) -> str:
    """A tool call's input as the arguments string chat keeps (compact JSON, one way
    for the answer recorded and the same call resent)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _text_of(value: Any, at: str) -> str:
    if not isinstance(value, str):
        raise _invalid(at, "must be a string")
    return value


def _said(value: Any, at: str) -> str:
    """A text block's text as Anthropic takes it: some text, not only whitespace (kept,
    memory would send it on every later turn, each refused)."""
    text = _text_of(value, at)
    if not text:
        raise _invalid(at, "text content blocks must be non-empty")
    if not text.strip():
        raise _invalid(at, "text content blocks must contain non-whitespace text")
    return text


def _source(block: dict[str, Any], at: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict) or not isinstance(source.get("type"), str):
        raise _invalid(f"{at}.source", "must be an object with a string type")
    return source


def _image_part(block: dict[str, Any], at: str) -> dict[str, Any]:
    source = _source(block, at)
    kind = source["type"]
    if kind == "base64":
        mime = _text_of(source.get("media_type"), f"{at}.source.media_type")
        data = _text_of(source.get("data"), f"{at}.source.data")
        return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}
    if kind == "url":
        url = _text_of(source.get("url"), f"{at}.source.url")
        return {"type": "image_url", "image_url": {"url": url}}
    return {"type": "text", "text": f"[image {kind}]"}


def _document_part(block: dict[str, Any], at: str) -> dict[str, Any]:
    source = _source(block, at)
    kind = source["type"]
    if kind == "base64" and source.get("media_type") == "application/pdf":
        data = _text_of(source.get("data"), f"{at}.source.data")
        file = {"file_data": f"data:application/pdf;base64,{data}"}
        if isinstance(block.get("title"), str):
            file["filename"] = block["title"]
        return {"type": "file", "file": file}
    if kind == "text":
        return {"type": "text", "text": _text_of(source.get("data"), f"{at}.source.data")}
    return {"type": "text", "text": "[document]"}


def _part(block: dict[str, Any], at: str) -> dict[str, Any] | None:
    """A user block as a chat part (None: not stored)."""
    kind = block["type"]
    if kind == "text":
        return {"type": "text", "text": _text_of(block.get("text"), f"{at}.text")}
    if kind == "image":
        return _image_part(block, at)
    if kind == "document":
        return _document_part(block, at)
    if kind in NOT_STORED:
        return None
    return {"type": "text", "text": f"[{kind}]"}


def _blocks(content: Any, at: str, role: str = "") -> list[dict[str, Any]]:
    """The blocks of a content; with ``role``, those the API takes in its messages."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _invalid(at, "must be a string or an array of content blocks")
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _invalid(f"{at}.{i}", "content blocks must be objects with a string type")
        if block["type"] in _NOT_IN.get(role, ()):
            # Read as the other side's, it would vanish from the conversation forwarded
            # (where the upstream would have refused it) and the rest be stored without it.
            kind = block["type"]
            raise _invalid(
                f"{at}.{i}.type", f"`{kind}` blocks are not allowed in `{role}` messages"
            )
    return content


def _tool_result(block: dict[str, Any], at: str) -> Message:
    call_id = _text_of(block.get("tool_use_id"), f"{at}.tool_use_id")
    content = block.get("content", "")
    if isinstance(content, str):
        text: Any = content
    else:
        parts = [_part(b, f"{at}.content.{i}") for i, b in enumerate(_blocks(content, at))]
        kept = [part for part in parts if part is not None]
        text = content_text(kept) if all(p["type"] == "text" for p in kept) else kept
    return Message(role="tool", content=text, tool_call_id=call_id)


def _user(content: Any, at: str) -> list[Message]:
    """A user message: its tool results (tool messages), then what else it says."""
    if isinstance(content, str):
        return [Message(role="user", content=content)]
    out: list[Message] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(_blocks(content, at, "user")):
        if block["type"] == "text":
            _said(block.get("text"), f"{at}.{i}.text")
        if block["type"] == "tool_result":
            out.append(_tool_result(block, f"{at}.{i}"))
        elif (part := _part(block, f"{at}.{i}")) is not None:
            parts.append(part)
    if parts or not out:
        out.append(Message(role="user", content=parts))
    return out


def _assistant(content: Any, at: str) -> Message:
    if isinstance(content, str):
        return Message(role="assistant", content=content)
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(_blocks(content, at, "assistant")):
        kind = block["type"]
        if kind == "text":
            texts.append(_text_of(block.get("text"), f"{at}.{i}.text"))
        elif kind == "tool_use":
            call_id = _text_of(block.get("id"), f"{at}.{i}.id")
            name = _text_of(block.get("name"), f"{at}.{i}.name")
            tool_input = block.get("input", {})
            if not isinstance(tool_input, dict):
                # Stored, it would go back as {} (all the API takes): not what was sent.
                raise _invalid(f"{at}.{i}.input", "must be an object")
            function = {"name": name, "arguments": arguments(tool_input)}
            calls.append({"id": call_id, "type": "function", "function": function})
    return Message(role="assistant", content="".join(texts), tool_calls=tuple(calls) or None)


def messages_from_anthropic(value: Any) -> Converted:
    """A request's ``messages`` as chat messages (400 naming the field it cannot read)."""
    if not isinstance(value, list) or not value:
        raise _invalid("messages", "must be a non-empty array of messages")
    messages: list[Message] = []
    origins: list[str] = []
    for n, message in enumerate(value):
        at = f"messages.{n}"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise _invalid(f"{at}.role", "must be 'user', 'assistant' or 'system'")
        if "content" not in message:
            raise _invalid(f"{at}.content", "required")
        content, field, role = message["content"], f"{at}.content", message["role"]
        if role != "system" and not (role == "assistant" and n == len(value) - 1):
            _check_said(content, at)
        if role == "system":
            # A system message in the conversation (Anthropic's mid-conversation-system
            # beta; Claude Code sends them): the client's prompt, as chat's are.
            texts = [
                _text_of(b.get("text"), f"{field}.{i}.text")
                for i, b in enumerate(_blocks(content, field))
            ]
            made = [Message(role="system", content="\n".join(texts))]
        else:
            made = _user(content, field) if role == "user" else [_assistant(content, field)]
        messages += made
        origins += [at] * len(made)
    return Converted(tuple(messages), tuple(origins))


def _check_said(content: Any, at: str) -> None:
    """Refuse an empty message, as Anthropic does (but a final assistant one: a prefill).
    Dropped from the context (the API takes no empty message), it would turn the request
    into another (the answer before it continued), and stored, go from every later one."""
    if content == "" or content == []:
        raise _invalid(
            at,
            "all messages must have non-empty content except for the optional final "
            "assistant message",
        )
    if isinstance(content, str):
        _said(content, f"{at}.content")


def answer_message(content: Any) -> Message | None:
    """An answer's ``content`` blocks as the assistant message memory records."""
    if not isinstance(content, list):
        return None
    try:
        return _assistant(content, "content")
    except InvalidRequest:
        return None


# --- Going out: the assembled context (chat-format dicts) as Anthropic's fields. ---


def _data_url_source(url: str) -> dict[str, Any] | None:
    """A base64 data URL as Anthropic's base64 source; None: not one (sent as text)."""
    try:
        mime, data = media.data_url_payload(url)
    except media.MediaError:
        return None
    return {"type": "base64", "media_type": mime, "data": data}


def _text_block(text: str) -> dict[str, Any] | None:
    """A text block, or None for one Anthropic refuses (empty, or only whitespace: a chat
    message may hold that, and sent it would fail every later turn of the session)."""
    return {"type": "text", "text": text} if text.strip() else None


def _file_block(file: dict[str, Any]) -> dict[str, Any]:
    """A chat file part as a document: a PDF as Anthropic's base64 source takes only
    that, a plain text file as a text source; any other file as its name."""
    url = file.get("file_data")
    source = _data_url_source(url) if isinstance(url, str) and media.is_data_url(url) else None
    if source is not None and source["media_type"] == "application/pdf":
        return {"type": "document", "source": source}
    if source is not None and source["media_type"] == "text/plain":
        try:
            text = base64.b64decode(source["data"], validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            text = ""
        if text.strip():
            return {"type": "document", "source": {**source, "type": "text", "data": text}}
    name = file.get("filename")
    return {"type": "text", "text": f"[file {name}]" if isinstance(name, str) else "[file]"}


def _block(part: Any) -> dict[str, Any] | None:
    """A chat part as an Anthropic block (None: nothing to send)."""
    if isinstance(part, str):
        return _text_block(part)
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind == "image_url" and media.is_image(part):
        url = media.image_url(part)
        if media.is_data_url(url):
            source = _data_url_source(url)
        elif media.is_acceptable_url(url) and not url.startswith(media.REF_PREFIX):
            source = {"type": "url", "url": url}
        else:
            source = None
        if source is None:
            return {"type": "text", "text": media.placeholder(part)}
        return {"type": "image", "source": source}
    if kind == "file" and isinstance(part.get("file"), dict):
        return _file_block(part["file"])
    if kind in ("text", "refusal"):
        return _text_block(content_text([part]))
    text = content_text([part]) or (f"[{kind}]" if isinstance(kind, str) else "")
    return _text_block(text)


def content_blocks(content: Any) -> list[dict[str, Any]]:
    parts = content if isinstance(content, list) else [content_text(content)]
    return [block for part in parts if (block := _block(part)) is not None]


def _tool_input(arguments_: Any) -> Any:
    try:
        value = json.loads(arguments_) if isinstance(arguments_, str) else arguments_
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# What Anthropic takes as a tool_use block's id, and as a tool's name.
_ID = re.compile(r"[a-zA-Z0-9_-]+")
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")


def anthropic_id(value: Any) -> str:
    """A tool call's id as Anthropic takes it: as it is, or (a chat upstream's, say
    ``functions.get_weather:0``) its other characters as "_" and a hash of it, so that
    two ids stay two. The same for the call and the result that answers it."""
    text = value if isinstance(value, str) else ""
    if _ID.fullmatch(text):
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{re.sub(r'[^a-zA-Z0-9_-]', '_', text)[:64]}_{digest}"


def _call_block(call: Any) -> dict[str, Any]:
    """A chat tool call as a tool_use block: a function's, or a custom tool's (its
    free-form input under ``input``)."""
    call = call if isinstance(call, dict) else {}
    function, custom = call.get("function"), call.get("custom")
    if isinstance(function, dict):
        name, tool_input = function.get("name"), _tool_input(function.get("arguments"))
    elif isinstance(custom, dict):
        name, tool_input = custom.get("name"), {"input": custom.get("input")}
    else:
        name, tool_input = None, {}
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        name = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:128] if isinstance(name, str) else ""
    return {
        "type": "tool_use",
        "id": anthropic_id(call.get("id")),
        "name": name or "tool",
        "input": tool_input,
    }


def _assistant_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """An assistant's text and calls: an image or a file memory holds of one (imported,
    say) as a short text, as Anthropic takes neither from the assistant."""
    blocks = [
        block if block["type"] == "text" else {"type": "text", "text": f"[{block['type']}]"}
        for block in content_blocks(message.get("content"))
    ]
    return blocks + [_call_block(call) for call in message.get("tool_calls") or ()]


def _result_block(message: dict[str, Any]) -> dict[str, Any]:
    """A tool message as a tool_result: its text, or its blocks when it holds an image
    or a file (a screenshot, a page read: Anthropic takes them there)."""
    result: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": anthropic_id(message.get("tool_call_id")),
    }
    content = message.get("content")
    if isinstance(content, list) and any(_kind(part) in ("image_url", "file") for part in content):
        result["content"] = content_blocks(content)
    elif (text := content_text(content)).strip():
        result["content"] = text  # (optional: a blank text is no block Anthropic takes)
    return result


def _kind(part: Any) -> Any:
    return part.get("type") if isinstance(part, dict) else None


def _side(role: Any, started: bool) -> str:
    """Whose turn a message is ("": memory's prompt, before the conversation began)."""
    if role == "assistant":
        return "assistant"
    return "user" if started or role not in PROMPT_ROLES else ""


def to_anthropic(
    context: Sequence[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The context as (system text blocks, messages): its leading prompt-role messages
    (memory's) go to ``system``, the rest to messages, one per side in turn, each
    user message's tool results first."""
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    started = False
    for message in context:
        role = message.get("role")
        side = _side(role, started)
        if not side:
            system += content_blocks(message.get("content"))
            continue
        started = True
        if role == "assistant":
            blocks = _assistant_blocks(message)
        elif role == "tool":
            blocks = [_result_block(message)]
        else:
            blocks = content_blocks(message.get("content"))
        if not blocks:
            continue  # Anthropic refuses an empty message
        if messages and messages[-1]["role"] == side:
            messages[-1]["content"] += blocks
        else:
            messages.append({"role": side, "content": blocks})
    for message in messages:
        if message["role"] == "user":  # tool results first (a stable sort keeps the order)
            message["content"].sort(key=lambda block: block["type"] != "tool_result")
    if messages and messages[0]["role"] != "user":
        messages.insert(0, {"role": "user", "content": [{"type": "text", "text": CONTINUED}]})
    return system, messages
