"""Plain data of a conversation's memory: messages and the loaded session state."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

# Roles that are part of the conversation record and get an index; system/developer
# messages belong to the client's prompt, not to the conversation.
CONVERSATION_ROLES = frozenset({"user", "assistant", "tool", "function"})
PROMPT_ROLES = frozenset({"system", "developer"})


def content_text(content: Any) -> str:
    """The text of a message's content, whether a string or a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif part.get("type") == "image_url":
                    url = (part.get("image_url") or {}).get("url", "")
                    parts.append(f"[image {url[:64]}]")
                elif isinstance(part.get("refusal"), str):
                    parts.append(part["refusal"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return str(content)


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message; ``index`` is its 1-based place in the session (0: not stored yet)."""

    role: str
    content: Any = None
    tool_calls: tuple[dict[str, Any], ...] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    index: int = 0
    tokens: int = 0
    ts: float = 0.0

    @classmethod
    def from_openai(cls, data: dict[str, Any]) -> Message:
        tool_calls = data.get("tool_calls")
        return cls(
            role=data["role"],
            content=data.get("content"),
            tool_calls=tuple(tool_calls) if tool_calls else None,
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
        )

    def to_openai(self) -> dict[str, Any]:
        """The message as the chat-completions API takes it (no gateway bookkeeping)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = list(self.tool_calls)
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    def to_json(self) -> str:
        """The stored form; the index is the message's position in the log, not a field."""
        data = self.to_openai()
        data["tokens"] = self.tokens
        data["ts"] = self.ts
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str | bytes, index: int) -> Message:
        data = json.loads(raw)
        return replace(
            cls.from_openai(data),
            index=index,
            tokens=int(data.get("tokens", 0)),
            ts=data.get("ts", 0.0),
        )

    @property
    def text(self) -> str:
        return content_text(self.content)

    def same_turn_as(self, other: Message) -> bool:
        """Whether two messages are the same utterance (as a client resends it)."""
        if self.role != other.role or self.text != other.text:
            return False
        if self.tool_call_id != other.tool_call_id:
            return False
        return _tool_call_ids(self) == _tool_call_ids(other)


def _tool_call_ids(message: Message) -> tuple[str, ...]:
    return tuple(str(call.get("id", "")) for call in message.tool_calls or ())


@dataclass(frozen=True, slots=True)
class SessionState:
    """What one request loads of a session: its size and its newest stored messages."""

    message_count: int = 0
    tail: tuple[Message, ...] = ()
    user_id: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
