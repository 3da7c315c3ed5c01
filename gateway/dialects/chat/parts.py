"""Content parts as the chat-completions API takes them, by role (pure).

A session may mix both APIs, and the Responses API has parts chat does not: an image by
``file_id``, a file by URL, an image in a function's output. Memory keeps what the client
sent; a chat request forwards each part chat would refuse as a short text instead, or
the whole request would be refused, at this turn and every later one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.memory import images as media

# The part types each role may send through chat completions.
_TAKEN = {
    "user": frozenset({"text", "image_url", "input_audio", "file"}),
    "assistant": frozenset({"text", "refusal"}),
    "tool": frozenset({"text"}),
    "system": frozenset({"text"}),
    "developer": frozenset({"text"}),
}


def text_only(content: Any) -> str | None:
    """The text of content made of text parts alone (joined by newlines), else None: sent
    as one string, the form every chat server takes (llama-cpp-python's chat templates
    add content to a string, and answer a list with a 500)."""
    if not isinstance(content, list) or not content:
        return None
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text":
            return None
        text = part.get("text")
        if not isinstance(text, str):
            return None
        texts.append(text)
    return "\n".join(texts)


def chat_shaped(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages, each content part chat does not take for its role as text, and
    content of text parts alone as one string (``text_only``)."""
    shaped = []
    for message in messages:
        taken = _TAKEN.get(message.get("role", ""))
        content = message.get("content")
        text = text_only(content)
        if text is not None:
            shaped.append({**message, "content": text})
            continue
        if (
            taken is None
            or not isinstance(content, list)
            or all(_type(part) in taken for part in content)
        ):
            shaped.append(message)
            continue
        parts = [part if _type(part) in taken else _as_text(part) for part in content]
        shaped.append({**message, "content": parts})
    return shaped


def _type(part: Any) -> Any:
    return part.get("type") if isinstance(part, dict) else None


def _as_text(part: Any) -> dict[str, str]:
    """``[image …]`` for an image, else the part's type and what names its file."""
    if isinstance(part, dict) and media.is_image(part):
        return {"type": "text", "text": media.placeholder(part)}
    kind = _type(part) or "part"
    named = part.get("file_id") or part.get("filename") if isinstance(part, dict) else None
    return {"type": "text", "text": f"[{kind} {named}]" if isinstance(named, str) else f"[{kind}]"}
