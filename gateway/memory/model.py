"""Plain data of a conversation's memory: messages and the loaded session state."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway import codec
from gateway.caching import BoundedMap
from gateway.memory import images as media

# Roles that are part of the conversation record and get an index; system/developer
# messages belong to the client's prompt, not to the conversation.
CONVERSATION_ROLES = frozenset({"user", "assistant", "tool", "function"})
PROMPT_ROLES = frozenset({"system", "developer"})
# Derived values one Tiers keeps (``Tiers.derived``): one a composition and model in use.
DERIVED_ENTRIES = 8
# One Responses API output item an answer came as: (its id, its type, its call_id for a
# function_call, else ""). A client's ``item_reference`` names it (``memory.references``).
OutputItem = tuple[str, str, str]


def call_texts(tool_calls: Any) -> list[str]:
    """The names and arguments of tool calls (a list or tuple of OpenAI's call objects):
    text that is stored and indexed like a message's content."""
    texts = []
    for call in tool_calls if isinstance(tool_calls, list | tuple) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            pair = (function.get("name"), function.get("arguments"))
            texts += [value for value in pair if isinstance(value, str)]
    return texts


# What recall matches an image by: the one word. Its size and hash (the placeholder's)
# are no words anyone asks by, and a message of 100 images made ~2,300 tokens of them
# to stem and embed on the event loop.
RECALLED_IMAGE = "[image]"
# The encoding of a stored message's ``line_tokens`` (the one the gateway ships, which
# counts for every model whose own encoding it does not have).
LINE_ENCODING = "cl100k_base"


def _recalled_image(_: dict[str, Any]) -> str:
    return RECALLED_IMAGE


def content_text(content: Any, image: Callable[[dict[str, Any]], str] | None = None) -> str:
    """The text of a message's content, whether a string or a list of content parts; an
    image as ``image(part)`` (its placeholder unless given)."""
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
                    parts.append((image or media.placeholder)(part))  # never its bytes
                elif isinstance(part.get("refusal"), str):
                    parts.append(part["refusal"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return str(content)


def with_refusal(content: Any, refusal: Any) -> Any:
    """An assistant's content with its ``refusal`` (the field OpenAI's SDK keeps beside
    ``content``) made a refusal part after any text.

    A client appends a refused answer to its history as returned: content null and the
    refusal beside it. Stored without the refusal, it is an assistant message with
    nothing in it, which OpenAI refuses on every later turn; a refusal part is content
    the chat API takes on an assistant message. Its text (``content_text``) is the
    refusal, as the upstream's own refused answer is stored (``proxy.accumulate``), so a
    resent history matches the stored log.
    """
    if not isinstance(refusal, str):
        return content
    part = {"type": "refusal", "refusal": refusal}
    if content is None or content == "":
        return [part]
    if isinstance(content, str):
        return [{"type": "text", "text": content}, part]
    if isinstance(content, list):
        return [*content, part]
    return content  # (not a content the request validation lets through)


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
    # The upstream's output items this answer came as (Responses API; () otherwise). Kept
    # with the stored message, never forwarded: see ``memory.references``.
    output_items: tuple[OutputItem, ...] = ()
    # The tokens of the message's line as recall shows it (``block.recalled_line``'s
    # piece), in ``LINE_ENCODING``: counted once, when it is recorded, not at the first
    # turn of every process that recalls it (0: not counted, a long or an older message).
    line_tokens: int = 0

    @classmethod
    def from_openai(cls, data: dict[str, Any]) -> Message:
        tool_calls = data.get("tool_calls")
        content = data.get("content")
        if data["role"] == "assistant":
            content = with_refusal(content, data.get("refusal"))
        return cls(
            role=data["role"],
            content=content,
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

    def to_json(self) -> bytes:
        """The stored form; the index is the message's position in the log, not a field."""
        data = self.to_openai()
        data["tokens"] = self.tokens
        data["ts"] = self.ts
        if self.output_items:
            data["output_items"] = self.output_items
        if self.line_tokens:
            data["line_tokens"] = self.line_tokens
        return codec.dumps(data)

    @classmethod
    def from_json(cls, raw: str | bytes, index: int) -> Message:
        """A stored message (``to_json``) at its place in the log. Parsed each time: the
        store keeps what it parses (``store.parsed_messages``)."""
        return cls.from_data(codec.loads(raw), index)

    @classmethod
    def from_data(cls, data: dict[str, Any], index: int) -> Message:
        """A stored message already read as JSON (``to_json``'s fields)."""
        # Built in one call, not from_openai + replace: every request parses the
        # session's stored tail (up to memory.reconcile_tail messages), and the copy
        # doubled the cost.
        tool_calls = data.get("tool_calls")
        items = data.get("output_items")
        return cls(
            data["role"],
            data.get("content"),
            tuple(tool_calls) if tool_calls else None,
            data.get("tool_call_id"),
            data.get("name"),
            index,
            int(data.get("tokens", 0)),
            data.get("ts", 0.0),
            tuple((str(i), str(t), str(c)) for i, t, c in items) if items else (),
            int(data.get("line_tokens", 0)),
        )

    def but(
        self,
        *,
        index: int | None = None,
        tokens: int | None = None,
        ts: float | None = None,
        line_tokens: int | None = None,
    ) -> Message:
        """A copy with its bookkeeping changed (place in the log, token counts, time), in
        one call: ``dataclasses.replace`` costs twice as much, and a turn makes several."""
        return Message(
            self.role,
            self.content,
            self.tool_calls,
            self.tool_call_id,
            self.name,
            self.index if index is None else index,
            self.tokens if tokens is None else tokens,
            self.ts if ts is None else ts,
            self.output_items,
            self.line_tokens if line_tokens is None else line_tokens,
        )

    def with_content(self, content: Any, tokens: int | None = None) -> Message:
        """A copy with other content (parts replaced by placeholders, say), and its
        token count when that changed."""
        return Message(
            self.role,
            content,
            self.tool_calls,
            self.tool_call_id,
            self.name,
            self.index,
            self.tokens if tokens is None else tokens,
            self.ts,
            self.output_items,
        )

    @property
    def text(self) -> str:
        return content_text(self.content)

    @property
    def recall_text(self) -> str:
        """What recall indexes, embeds and searches by: the text, an image as a word."""
        return content_text(self.content, _recalled_image)

    def same_turn_as(self, other: Message) -> bool:
        """Whether two messages are the same utterance (as a client resends it)."""
        if self.role != other.role or self.text != other.text:
            return False
        if self.tool_call_id != other.tool_call_id:
            return False
        return _tool_call_ids(self) == _tool_call_ids(other)


def _tool_call_ids(message: Message) -> tuple[str, ...]:
    return tuple(str(call.get("id", "")) for call in message.tool_calls or ())


# --- Long-term tiers (plain data; every tier's state lives in one versioned document) ---


@dataclass(frozen=True, slots=True)
class Summary:
    """A summary of the messages ``start``..``end`` (inclusive, 1-based indexes)."""

    start: int
    end: int
    text: str
    ts: float = 0.0
    fallback: bool = False  # made without the model (it failed or was unreachable)
    # When its first and last messages were said (0: unknown).
    since: float = 0.0
    until: float = 0.0

    def to_data(self) -> dict[str, Any]:
        data = {"range": {"start": self.start, "end": self.end}, "text": self.text,
                "ts": self.ts, "fallback": self.fallback}  # fmt: skip
        if self.since or self.until:
            data["span"] = {"since": self.since, "until": self.until}
        return data

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Summary:
        span = data.get("span") or {}
        return cls(data["range"]["start"], data["range"]["end"], data["text"], data.get("ts", 0.0),
                   data.get("fallback", False), span.get("since", 0.0),
                   span.get("until", 0.0))  # fmt: skip


@dataclass(frozen=True, slots=True)
class RollingSummary:
    """One evolving summary (seed 001's recursive summary, seed 002's rolling summary).

    ``turn`` is the last user turn folded in (seed 002); ``version`` grows by one with
    every write and never goes back.
    """

    text: str
    start: int
    end: int
    version: int = 1
    turn: int = 0
    ts: float = 0.0
    fallback: bool = False

    def to_data(self) -> dict[str, Any]:
        return {"text": self.text, "range": {"start": self.start, "end": self.end},
                "version": self.version, "turn": self.turn, "ts": self.ts,
                "fallback": self.fallback}  # fmt: skip

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> RollingSummary:
        return cls(data["text"], data["range"]["start"], data["range"]["end"],
                   data.get("version", 1), data.get("turn", 0), data.get("ts", 0.0),
                   data.get("fallback", False))  # fmt: skip


@dataclass(frozen=True, slots=True)
class KeyQA:
    """Seed 002's key question/answer pair, compressed, with relevance tags."""

    q: str
    a: str
    tags: tuple[str, ...] = ()
    turn: int = 0

    def to_data(self) -> dict[str, Any]:
        return {"q": self.q, "a": self.a, "tags": list(self.tags), "turn": self.turn}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> KeyQA:
        return cls(data["q"], data["a"], tuple(data.get("tags", ())), data.get("turn", 0))


@dataclass(frozen=True, slots=True)
class Fact:
    """A durable fact from messages ``start``..``end`` (seed 003's key facts).

    ``key`` names what it is about; a newer fact with the same key supersedes it.
    """

    text: str
    start: int = 0
    end: int = 0
    key: str = ""
    superseded: bool = False
    fallback: bool = False  # read from the user's words without the model
    ts: float = 0.0  # when its last source message was said (0: unknown)
    # Written through the memory API to replace a fact: what it replaced, found again
    # in the messages, does not come back over it (``durable.merge``).
    corrected: bool = False

    def to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"text": self.text, "range": {"start": self.start, "end": self.end}}
        if self.key:
            data["key"] = self.key
        if self.superseded:
            data["superseded"] = True
        if self.fallback:
            data["fallback"] = True
        if self.ts:
            data["ts"] = self.ts
        if self.corrected:
            data["corrected"] = True
        return data

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Fact:
        span = data.get("range") or {}
        return cls(data["text"], span.get("start", 0), span.get("end", 0),
                   data.get("key", ""), bool(data.get("superseded", False)),
                   bool(data.get("fallback", False)), float(data.get("ts", 0.0)),
                   bool(data.get("corrected", False)))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Pin:
    """Seed 004's semantic pin: content kept in context by importance until removed."""

    id: str
    content: str
    importance: float = 0.8
    source_index: int | None = None
    pin_type: str = "manual"  # manual | auto
    created: float = 0.0

    def to_data(self) -> dict[str, Any]:
        return {"id": self.id, "content": self.content, "importance": self.importance,
                "source_index": self.source_index, "pin_type": self.pin_type,
                "created": self.created}  # fmt: skip

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Pin:
        return cls(data["id"], data["content"], float(data.get("importance", 0.8)),
                   data.get("source_index"), data.get("pin_type", "manual"),
                   data.get("created", 0.0))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Tiers:
    """Every summarizer-written tier of a session, written as one document with a version.

    A job writes a new Tiers only if the stored version is the one it read (compare and
    set), so a late or duplicate job can never overwrite a newer state.
    """

    version: int = 0
    summaries: tuple[Summary, ...] = ()  # oldest first
    rolling: RollingSummary | None = None
    key_qa: tuple[KeyQA, ...] = ()  # oldest first
    facts: tuple[Fact, ...] = ()  # oldest first
    facts_end: int = 0  # the last message durable facts were extracted from
    # What is made of these tiers alone (the memory block's items of them, for a
    # composition and a counter: ``block.tier_items``), kept with the value it is made
    # of: it lives as long as this parse, which the store reuses while the stored bytes
    # are unchanged. Not part of the value (equality, repr); a changed copy starts empty.
    derived: BoundedMap[Any, Any] = field(
        default_factory=lambda: BoundedMap(DERIVED_ENTRIES),
        init=False,
        repr=False,
        compare=False,
    )

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version,
                "summaries": [s.to_data() for s in self.summaries],
                "rolling": self.rolling.to_data() if self.rolling else None,
                "key_qa": [k.to_data() for k in self.key_qa],
                "facts": [f.to_data() for f in self.facts],
                "facts_end": self.facts_end,
            },
            separators=(",", ":"),
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, raw: str | bytes | None) -> Tiers:
        if not raw:
            return cls()
        data = codec.loads(raw)
        rolling = data.get("rolling")
        return cls(
            version=int(data.get("version", 0)),
            summaries=tuple(Summary.from_data(s) for s in data.get("summaries", ())),
            rolling=RollingSummary.from_data(rolling) if rolling else None,
            key_qa=tuple(KeyQA.from_data(k) for k in data.get("key_qa", ())),
            facts=tuple(Fact.from_data(f) for f in data.get("facts", ())),
            facts_end=int(data.get("facts_end", 0)),
        )


@dataclass(frozen=True, slots=True)
class SessionState:
    """What one request loads of a session: its size, newest messages, tiers and pins."""

    message_count: int = 0
    tail: tuple[Message, ...] = ()
    user_id: str | None = None
    tiers: Tiers = field(default_factory=Tiers)
    pins: tuple[Pin, ...] = ()
    pending_jobs: int = 0
    ended: bool = False
    turns: int = 0  # user messages so far (seed 002 counts turns)
    exists: bool = False
    updated: float = 0.0  # the last record's time (0: never)
    profile: dict[str, Any] | None = None  # the user's cross-session profile
    history: tuple[dict[str, Any], ...] = ()  # the user's last ended sessions
    active: tuple[str, ...] = ()  # the user's sessions not ended, the latest active first
    # The fingerprint of the context last forwarded for it (``prompt_cache``; "": none).
    forwarded: str = ""
