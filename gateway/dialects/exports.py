"""ChatGPT's and Claude's data exports (their ``conversations.json``) as conversations to
import: one session per conversation, its messages with the times they were said.

Pure: it reads values already decoded from JSON (``memory-gateway import --from`` walks the
file's array one conversation at a time; the memory API parses its body), and checks
everything it takes, so that a bad file is refused naming the conversation at fault
(``ExportError``) before anything is imported.

The shapes, as the services' exports write them (and as public parsers of them read them:
mitkury/chatgpt-export-parser docs/chatgpt-data-export-format.md, Sinity/polylogue
docs/providers/claude-ai.md):

* ChatGPT: an array of ``{"id"/"conversation_id", "title", "create_time", "mapping",
  "current_node"}``. ``mapping`` is a tree of nodes ``{"message", "parent", "children"}``:
  an edited question or a regenerated answer is a sibling, and ``current_node`` is the end
  of the branch the user last saw. That branch is the conversation: the path from the
  root to ``current_node``. A message is ``{"author": {"role"}, "create_time" (Unix
  seconds), "content": {"content_type", "parts"}, "metadata", "recipient"}``.
* Claude: an array of ``{"uuid", "name", "created_at", "chat_messages"}``, each message
  ``{"sender": "human"|"assistant", "text", "content": [{"type": "text", "text"}, …],
  "created_at" (ISO 8601), "attachments", "files"}``, in order (no branches).

Only what was said between the user and the assistant is kept: system messages (custom
instructions), tool calls and their output, hidden messages, reasoning and empty messages
are dropped (counted). An image becomes "[image]" and an attached file
"[attachment: NAME]", so that the text around them still reads.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gateway.auth.identity import check_id
from gateway.errors import InvalidRequest

FORMATS = ("chatgpt", "claude")

# Times a message may carry (the memory API's bounds): 1970 to 2100.
_EARLIEST, _LATEST = 0.0, 4_102_444_800.0
# ChatGPT's content types that are conversation text; the others are tool calls and
# their output (code, execution_output, tether_quote…) or reasoning (thoughts…).
_CHATGPT_TEXT = ("text", "multimodal_text")
_SHOWN_ID_CHARS = 60


class ExportError(ValueError):
    """A conversation of an export that cannot be imported: its position (1-based) in
    the file, its id when it has one, and why."""

    def __init__(self, number: int | None, reason: str, source_id: str | None = None) -> None:
        where = f"conversation {number}" if number else ""
        if number and source_id:
            shown = source_id if len(source_id) <= _SHOWN_ID_CHARS else source_id[:59] + "…"
            where += f" ({shown})"
        super().__init__(f"{where}: {reason}" if where else reason)
        self.number = number
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Conversation:
    number: int  # its position in the file, from 1
    source_id: str  # the service's id for it
    session_id: str  # the session it is imported into
    title: str
    # {"role": "user"|"assistant", "content": str, "timestamp"?: Unix seconds}
    messages: tuple[dict[str, Any], ...]
    dropped: int  # messages of its branch not imported (system, tool, hidden, empty)


def read_conversation(fmt: str, number: int, value: Any) -> Conversation:
    """The conversation ``value`` (the ``number``-th of an export in format ``fmt``)."""
    if not isinstance(value, dict):
        raise ExportError(number, f"expected a conversation object, found {json_kind(value)}")
    if fmt == "chatgpt":
        return _chatgpt(number, value)
    if fmt == "claude":
        return _claude(number, value)
    raise ValueError(f"unknown export format {fmt!r}")


def read_export(fmt: str, data: Any) -> Iterator[Conversation]:
    """Every conversation of a whole export already decoded (the memory API's body)."""
    if not isinstance(data, list):
        raise ExportError(None, f"expected an array of conversations, found {json_kind(data)}")
    for number, value in enumerate(data, start=1):
        yield read_conversation(fmt, number, value)


# --- ChatGPT -------------------------------------------------------------------------


def _chatgpt(number: int, value: dict[str, Any]) -> Conversation:
    mapping = value.get("mapping")
    if not isinstance(mapping, dict):
        hint = ": is this a Claude export?" if "chat_messages" in value else ""
        raise ExportError(number, f'"mapping" must be an object, not {json_kind(mapping)}{hint}')
    source_id, session_id = _ids("chatgpt", value.get("conversation_id") or value.get("id"), number)
    fallback = _seconds(value.get("create_time"))
    messages: list[dict[str, Any]] = []
    dropped = 0
    for node in _branch(mapping, value.get("current_node"), number, source_id):
        message = node.get("message")
        if message is None:  # the root's placeholder
            continue
        if not isinstance(message, dict):
            raise ExportError(number, f"a node's message is {json_kind(message)}", source_id)
        found = _chatgpt_message(message)
        if found is None:
            dropped += 1
            continue
        role, text = found
        position = len(messages) + 1
        messages.append(
            _message(role, text, _seconds(message.get("create_time")) or fallback, number,
                     source_id, position)
        )  # fmt: skip
    return Conversation(number, source_id, session_id, _title(value.get("title")),
                        tuple(messages), dropped)  # fmt: skip


def _branch(mapping: dict[str, Any], current: Any, number: int, source_id: str) -> list[Any]:
    """The nodes from the root to ``current`` (the branch the user last saw)."""
    if current is None:
        current = _last_leaf(mapping)
    path: list[dict[str, Any]] = []
    seen: set[str] = set()
    node_id = current
    while node_id is not None:
        node = mapping.get(node_id) if isinstance(node_id, str) else None
        if not isinstance(node, dict):
            raise ExportError(number, f'node {_shown(node_id)} is not in its "mapping"', source_id)
        if node_id in seen:
            raise ExportError(number, "its nodes' parents make a cycle", source_id)
        seen.add(node_id)
        path.append(node)
        node_id = node.get("parent")
    path.reverse()
    return path


def _last_leaf(mapping: dict[str, Any]) -> str | None:
    """Without ``current_node``: from the root, the newest child each time (an edit or a
    regeneration is added after the branch it replaces)."""
    roots = [k for k, node in mapping.items() if isinstance(node, dict) and not node.get("parent")]
    node_id = roots[0] if roots else None
    seen: set[str] = set()
    while node_id is not None and node_id not in seen:
        seen.add(node_id)
        node = mapping.get(node_id)
        children = node.get("children") if isinstance(node, dict) else None
        if not (isinstance(children, list) and children and isinstance(children[-1], str)):
            break
        if children[-1] not in mapping:
            break
        node_id = children[-1]
    return node_id


def _chatgpt_message(message: dict[str, Any]) -> tuple[str, str] | None:
    """The role and text of a message the user saw; None for one to drop."""
    author = message.get("author")
    role = author.get("role") if isinstance(author, dict) else None
    if role not in ("user", "assistant"):
        return None  # system (custom instructions), tool
    metadata = message.get("metadata")
    if isinstance(metadata, dict) and metadata.get("is_visually_hidden_from_conversation"):
        return None
    if role == "assistant" and message.get("recipient", "all") not in ("all", None):
        return None  # a call to a tool (python, browser, dalle…), not an answer
    content = message.get("content")
    if not isinstance(content, dict) or content.get("content_type") not in _CHATGPT_TEXT:
        return None
    parts = content.get("parts")
    pieces: list[str] = []
    for part in parts if isinstance(parts, list) else ():
        if isinstance(part, str):
            pieces.append(part)
        elif isinstance(part, dict):
            if part.get("content_type") == "image_asset_pointer":
                pieces.append("[image]")
            elif isinstance(part.get("text"), str):  # an audio transcription
                pieces.append(part["text"])
    text = "\n".join(piece for piece in pieces if piece.strip())
    return (role, text) if text.strip() else None


# --- Claude --------------------------------------------------------------------------


def _claude(number: int, value: dict[str, Any]) -> Conversation:
    chat = value.get("chat_messages")
    if not isinstance(chat, list):
        hint = ": is this a ChatGPT export?" if "mapping" in value else ""
        raise ExportError(number, f'"chat_messages" must be an array, not {json_kind(chat)}{hint}')
    source_id, session_id = _ids("claude", value.get("uuid"), number)
    fallback = _iso(value.get("created_at"), number, source_id)
    messages: list[dict[str, Any]] = []
    dropped = 0
    for message in chat:
        if not isinstance(message, dict):
            raise ExportError(number, f"a message is {json_kind(message)}", source_id)
        sender = message.get("sender")
        role = {"human": "user", "assistant": "assistant"}.get(
            sender.lower() if isinstance(sender, str) else ""
        )
        text = _claude_text(message)
        if role is None or not text.strip():
            dropped += 1
            continue
        position = len(messages) + 1
        when = _iso(message.get("created_at"), number, source_id) or fallback
        messages.append(_message(role, text, when, number, source_id, position))
    return Conversation(number, source_id, session_id, _title(value.get("name")),
                        tuple(messages), dropped)  # fmt: skip


def _claude_text(message: dict[str, Any]) -> str:
    """The message's text blocks (not its thinking or tool use), else its ``text``; and
    its attached files by name."""
    content = message.get("content")
    blocks = [
        block["text"]
        for block in (content if isinstance(content, list) else ())
        if isinstance(block, dict) and block.get("type") == "text"
        and isinstance(block.get("text"), str) and block["text"].strip()
    ]  # fmt: skip
    text = "\n\n".join(blocks)
    if not text and isinstance(message.get("text"), str):
        text = message["text"]
    names: list[str] = []
    for key in ("attachments", "files"):
        files = message.get(key)
        for file in files if isinstance(files, list) else ():
            name = file.get("file_name") if isinstance(file, dict) else None
            if isinstance(name, str) and name.strip() and name not in names:
                names.append(name)
    if not names:
        return text
    return "\n".join([text, *(f"[attachment: {name}]" for name in names)]).strip()


# --- shared --------------------------------------------------------------------------


def _ids(prefix: str, source_id: Any, number: int) -> tuple[str, str]:
    """The conversation's id, and its session's: ``chatgpt-ID``, ``claude-UUID``."""
    if not isinstance(source_id, str) or not source_id:
        raise ExportError(number, "it has no id (its session is named after it)")
    try:
        return source_id, check_id(f"{prefix}-{source_id}", "its session id")
    except InvalidRequest as error:
        raise ExportError(number, str(error), source_id) from None


def _message(
    role: str, text: str, when: float | None, number: int, source_id: str, position: int
) -> dict[str, Any]:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape ("\ud800"): it cannot be sent
        raise ExportError(
            number, f"message {position} is not valid Unicode (a lone surrogate)", source_id
        ) from None
    message: dict[str, Any] = {"role": role, "content": text}
    if when is not None:
        message["timestamp"] = when
    return message


def _seconds(value: Any) -> float | None:
    """Unix seconds, when ``value`` is a plausible time (ChatGPT's ``create_time``)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if number and _EARLIEST < value < _LATEST else None


def _iso(value: Any, number: int, source_id: str) -> float | None:
    """Claude's ISO 8601 times (UTC unless they say otherwise) as Unix seconds."""
    if value is None or value == "":
        return None
    try:
        if not isinstance(value, str):
            raise ValueError
        when = datetime.datetime.fromisoformat(value.strip())
    except ValueError:
        raise ExportError(
            number, f"{_shown(value)} is not an ISO 8601 date and time", source_id
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return _seconds(when.timestamp())


def _title(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def json_kind(value: Any) -> str:
    """What a JSON value is, as an error message names it ("an object", "null"...)."""
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "a number"
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_ID_CHARS else text[: _SHOWN_ID_CHARS - 1] + "…"
