"""What the fake Anthropic upstream refuses, with the status, error type and message
Anthropic's Messages API gives (its messages where known, quoted from the real API's
answers; the rest in its style).

``header_refusal`` checks the key (``x-api-key``, as Claude Code sends it, or
``Authorization: Bearer``, as the anthropic SDKs 2.x do) and ``anthropic-version`` (one of
``VERSIONS``). ``refusal`` checks the body: ``model``, ``max_tokens`` (not for a token
count; 0 only fills the cache), ``messages`` (non-empty; roles user, assistant and
system, the mid-conversation system message of the current API; the first user or
assistant one a user's), ``system``, each content block by type and role, ``tools``,
``thinking``, no sampling parameters under version 2026-10-21 (it removed them), at most
``MAX_BREAKPOINTS`` ``cache_control`` marks, each ``tool_use`` answered by a
``tool_result`` in the next message and each ``tool_result`` answering a ``tool_use`` of
the message before (consecutive messages of one role read as one, as the API merges
them; system messages set aside), and each ``thinking`` block's signature one this fake
gave.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from devsupport.fake_anthropic_cache import MAX_BREAKPOINTS, marks

# Claude Code 2.1 sends 2023-06-01; the anthropic SDKs 2.x 2026-10-21.
VERSIONS = ("2023-01-01", "2023-06-01", "2026-10-21")
# The sampling parameters API version 2026-10-21 removed.
REMOVED_IN_2026 = ("temperature", "top_p", "top_k")
_SERVER_TOOL_RESULTS = {
    "web_search_tool_result", "web_fetch_tool_result", "tool_search_tool_result",
    "code_execution_tool_result", "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
}  # fmt: skip
_BLOCK_TYPES = {
    "user": {"text", "image", "document", "tool_result", "search_result", "container_upload"},
    "assistant": {"text", "tool_use", "thinking", "redacted_thinking", "server_tool_use"}
    | _SERVER_TOOL_RESULTS,
    "system": {"text"},
}
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_IMAGE_TYPES = {"image/jpeg", "image/png", "image/gif", "image/webp"}
_SIGNING_KEY = b"fake-anthropic-thinking"


class Refusal(NamedTuple):
    status: int
    kind: str  # Anthropic's error type: invalid_request_error, authentication_error, ...
    message: str


def _invalid(message: str) -> Refusal:
    return Refusal(400, "invalid_request_error", message)


def signature(thinking: str) -> str:
    """The signature this fake gives a thinking block's text (Anthropic's is opaque too)."""
    digest = hashlib.sha256(_SIGNING_KEY + thinking.encode()).digest()
    return base64.b64encode(digest).decode()


def api_key(headers: Mapping[str, str]) -> str:
    """The key a request names: its ``x-api-key``, else its bearer token."""
    bearer = headers.get("authorization", "")
    token = bearer[len("bearer ") :] if bearer.lower().startswith("bearer ") else ""
    return headers.get("x-api-key", "").strip() or token.strip()


def header_refusal(headers: Mapping[str, str]) -> Refusal | None:
    if not api_key(headers):
        return Refusal(401, "authentication_error", "x-api-key header is required")
    version = headers.get("anthropic-version")
    if version is None:
        return _invalid("anthropic-version: header is required")
    if version not in VERSIONS and not re.fullmatch(r"20\d\d-\d\d-\d\d", version):
        return _invalid(f'anthropic-version: "{version}" is not a valid version')
    return None


def refusal(headers: Mapping[str, str], body: Any, *, count_only: bool) -> Refusal | None:
    """Why Anthropic would refuse this request, or None."""
    if not isinstance(body, dict):
        return _invalid("The request body is not a valid JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        return _invalid("model: Field required")
    if not count_only:
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            return _invalid("max_tokens: Field required")
        if max_tokens < 0:
            return _invalid("max_tokens: Input should be greater than or equal to 0")
    if "stream" in body and not isinstance(body["stream"], bool):
        return _invalid("stream: Input should be a valid boolean")
    if headers.get("anthropic-version") == "2026-10-21":
        for name in REMOVED_IN_2026:
            if name in body:
                return _invalid(f"{name}: Extra inputs are not permitted")
    for check in (_system_refusal, _tools_refusal, _thinking_refusal, _messages_refusal):
        found = check(body)
        if found is not None:
            return found
    count = marks([body.get("tools"), body.get("system"), body.get("messages")])
    count += 1 if body.get("cache_control") is not None else 0
    if count > MAX_BREAKPOINTS:
        return _invalid(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {count}."
        )
    return _cache_control_refusal(body)


def _system_refusal(body: dict[str, Any]) -> Refusal | None:
    system = body.get("system")
    if system is None or isinstance(system, str):
        return None
    if not isinstance(system, list):
        return _invalid("system: Input should be a valid string or a list of text blocks")
    for j, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            return _invalid(f"system.{j}.type: Input should be 'text'")
        found = _text_refusal(f"system.{j}", block)
        if found is not None:
            return found
    return None


def _tools_refusal(body: dict[str, Any]) -> Refusal | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        return _invalid("tools: Input should be a valid list")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            return _invalid(f"tools.{i}: Input should be a valid dictionary")
        if tool.get("type", "custom") != "custom":
            continue  # a server tool (web_search_…, bash_…): taken as it is
        if not _TOOL_NAME.match(str(tool.get("name", ""))):
            return _invalid(
                f"tools.{i}.custom.name: String should match pattern '{_TOOL_NAME.pattern}'"
            )
        if not isinstance(tool.get("input_schema"), dict):
            return _invalid(f"tools.{i}.custom.input_schema: Field required")
    return None


def _thinking_refusal(body: dict[str, Any]) -> Refusal | None:
    thinking = body.get("thinking")
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind in ("disabled", "adaptive", "between_tools"):
        return None
    if kind != "enabled":
        return _invalid(
            "thinking.type: Input should be 'enabled', 'disabled', 'between_tools' or 'adaptive'"
        )
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or budget < 1024:
        return _invalid(
            "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
        )
    if isinstance(body.get("max_tokens"), int) and body["max_tokens"] <= budget:
        return _invalid("`max_tokens` must be greater than `thinking.budget_tokens`.")
    return None


def _text_refusal(where: str, block: dict[str, Any]) -> Refusal | None:
    text = block.get("text")
    if not isinstance(text, str):
        return _invalid(f"{where}.text: Field required")
    if not text:
        return _invalid(f"{where}.text: text content blocks must be non-empty")
    if not text.strip():
        return _invalid(f"{where}.text: text content blocks must contain non-whitespace text")
    return None


def _source_refusal(where: str, block: dict[str, Any]) -> Refusal | None:
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source, dict):
        media = source.get("media_type")
        if block["type"] == "image" and media not in _IMAGE_TYPES:
            return _invalid(
                f"{where}.source.base64.media_type: Input should be 'image/jpeg', "
                "'image/png', 'image/gif' or 'image/webp'"
            )
        if not isinstance(source.get("data"), str):
            return _invalid(f"{where}.source.base64.data: Field required")
        return None
    if kind == "url" and isinstance(source, dict) and not isinstance(source.get("url"), str):
        return _invalid(f"{where}.source.url.url: Field required")
    if kind in ("url", "file") or (block["type"] == "document" and kind in ("text", "content")):
        return None
    return _invalid(
        f"{where}.source: Input tag '{kind}' found using 'type' does not match any of the "
        "expected tags"
    )


def _block_refusal(where: str, role: str, block: Any) -> Refusal | None:
    if not isinstance(block, dict):
        return _invalid(f"{where}: Input should be a valid dictionary")
    kind = block.get("type")
    if not any(kind in kinds for kinds in _BLOCK_TYPES.values()):
        return _invalid(
            f"{where}.type: Input tag '{kind}' found using 'type' does not match any of "
            "the expected tags"
        )
    if kind not in _BLOCK_TYPES[role]:
        return _invalid(f"{where}.type: `{kind}` blocks are not allowed in `{role}` messages")
    if kind == "text":
        return _text_refusal(where, block)
    if kind in ("image", "document"):
        return _source_refusal(where, block)
    if kind == "tool_use":
        if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
            return _invalid(f"{where}.tool_use: `id` and `name` are required")
        if not isinstance(block.get("input"), dict):
            return _invalid(f"{where}.tool_use.input: Input should be a valid dictionary")
    if kind == "tool_result":
        if not isinstance(block.get("tool_use_id"), str):
            return _invalid(f"{where}.tool_result.tool_use_id: Field required")
        content = block.get("content")
        if content is not None and not isinstance(content, str | list):
            return _invalid(f"{where}.tool_result.content: Input should be a valid string or list")
    if kind == "thinking":
        text, signed = block.get("thinking"), block.get("signature")
        if not isinstance(text, str) or not isinstance(signed, str):
            return _invalid(f"{where}.thinking: `thinking` and `signature` are required")
        if signed != signature(text):
            return _invalid(f"{where}: Invalid `signature` in `thinking` block")
    return None


def _messages_refusal(body: dict[str, Any]) -> Refusal | None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return _invalid("messages: Field required")
    if not messages:
        return _invalid("messages: at least one message is required")
    roles = tuple(_BLOCK_TYPES)
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return _invalid(f"messages.{i}: Input should be a valid dictionary")
        role, content = message.get("role"), message.get("content")
        if role not in roles:
            allowed = " or ".join(f"'{r}'" for r in roles)
            return _invalid(f"messages.{i}.role: Input should be {allowed}")
        if not isinstance(content, str | list):
            return _invalid(f"messages.{i}.content: Input should be a valid string or list")
        last = i == len(messages) - 1
        if not content and not (last and role == "assistant"):
            return _invalid(
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        for j, block in enumerate(content if isinstance(content, list) else ()):
            found = _block_refusal(f"messages.{i}.content.{j}", role, block)
            if found is not None:
                return found
    spoken = [m["role"] for m in messages if m["role"] != "system"]
    if not spoken or spoken[0] != "user":
        return _invalid('messages: first message must use the "user" role')
    return _pairing_refusal(messages)


class _Turn(NamedTuple):
    role: str
    first: int  # the index of its first message
    blocks: list[tuple[int, int, dict[str, Any]]]  # (message index, block index, block)


def _turns(messages: list[dict[str, Any]]) -> list[_Turn]:
    """The conversation as the API reads it: consecutive messages of one role merged,
    mid-conversation system messages set aside."""
    turns: list[_Turn] = []
    for i, message in enumerate(messages):
        if message["role"] == "system":
            continue
        content = message["content"]
        blocks = [(i, j, b) for j, b in enumerate(content)] if isinstance(content, list) else []
        if turns and turns[-1].role == message["role"]:
            turns[-1].blocks.extend(blocks)
        else:
            turns.append(_Turn(message["role"], i, blocks))
    return turns


def _pairing_refusal(messages: list[dict[str, Any]]) -> Refusal | None:
    turns = _turns(messages)
    for t, turn in enumerate(turns):
        before = turns[t - 1] if t and turns[t - 1].role == "assistant" else None
        asked = (
            {b["id"] for _, _, b in before.blocks if b["type"] == "tool_use"} if before else set()
        )
        for i, j, block in turn.blocks:
            if block["type"] == "tool_result" and block["tool_use_id"] not in asked:
                return _invalid(
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                    f"`tool_result` blocks: {block['tool_use_id']}. Each `tool_result` block "
                    "must have a corresponding `tool_use` block in the previous message."
                )
        if turn.role != "assistant":
            continue
        after = turns[t + 1] if t + 1 < len(turns) else None
        answered = (
            {b["tool_use_id"] for _, _, b in after.blocks if b["type"] == "tool_result"}
            if after
            else set()
        )
        missing = [
            b["id"]
            for _, _, b in turn.blocks
            if b["type"] == "tool_use" and b["id"] not in answered
        ]
        if missing:
            return _invalid(
                f"messages.{turn.first}: `tool_use` ids were found without `tool_result` "
                f"blocks immediately after: {', '.join(missing)}. Each `tool_use` block must "
                "have a corresponding `tool_result` block in the next message."
            )
    return None


def _cache_control_refusal(body: dict[str, Any]) -> Refusal | None:
    """Each ``cache_control`` must be ``{"type": "ephemeral"}``, with an optional ttl."""
    stack: list[Any] = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict):
            control = value.get("cache_control")
            if control is not None:
                if not isinstance(control, dict) or control.get("type") != "ephemeral":
                    return _invalid("cache_control.type: Input should be 'ephemeral'")
                if control.get("ttl", "5m") not in ("5m", "1h"):
                    return _invalid("cache_control.ttl: Input should be '5m' or '1h'")
            stack.extend(v for k, v in value.items() if k != "cache_control")
    return None
