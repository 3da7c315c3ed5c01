"""The client's newest message, forwarded as the client sent it (pure).

Memory keeps a Messages turn as chat messages (``blocks``): what chat has no form for is
kept as less (a tool result's ``is_error`` and its images' place, a document by URL or
by file id as ``[document]``, a ``search_result`` as its type, citations asked of a
document, a ``container_upload`` not at all). That is memory's business on later turns;
but the request's own newest message is the one the model is asked about now: read back
from memory, the model would answer a screenshot it was never shown, an error it was
told was a result. So the context's last user turn gets the client's blocks back:

* each tool result the client sent, by its ``tool_use_id``, in its place (first);
* the client's other blocks in place of memory's reading of them, at the turn's end,
  when the context's last message is the one they were read into (its text the same,
  one block for each block memory kept of them), else memory's reading stays.

The client's ``cache_control`` marks are left out, as on every message memory sends
(``breakpoints``: the four marks are the gateway's to place after the client's
``system`` and ``tools``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.dialects.anthropic.blocks import NOT_STORED, anthropic_id, content_blocks
from gateway.memory.model import Message, content_text


def latest_of(messages: Any) -> tuple[dict[str, Any], ...]:
    """The blocks of the request's last message, when it is a user's list of blocks."""
    last = messages[-1] if isinstance(messages, list) and messages else None
    if not isinstance(last, dict) or last.get("role") != "user":
        return ()
    content = last.get("content")
    return tuple(content) if isinstance(content, list) else ()


def _unmarked(block: dict[str, Any]) -> dict[str, Any]:
    """The block without its marks, and its content's blocks (a tool result's) without
    theirs."""
    out = {name: value for name, value in block.items() if name != "cache_control"}
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = [_unmarked(b) if isinstance(b, dict) else b for b in content]
    return out


def restore(
    messages: list[dict[str, Any]],
    latest: Sequence[dict[str, Any]],
    context: Sequence[dict[str, Any]],
    said: Message | None,
) -> None:
    """Put ``latest`` (the client's newest message's blocks) in place of memory's reading
    of them in ``messages`` (the context going out). ``said``: the client's newest
    message as memory read it (None: none)."""
    if not latest or not messages or messages[-1]["role"] != "user":
        return
    turn = messages[-1]["content"]
    results = {
        anthropic_id(block.get("tool_use_id")): block
        for block in latest
        if block.get("type") == "tool_result"
    }
    for i, block in enumerate(turn):
        sent = results.get(block.get("tool_use_id")) if block["type"] == "tool_result" else None
        if sent is not None:
            turn[i] = {**_unmarked(sent), "tool_use_id": block["tool_use_id"]}
    others = [block for block in latest if block.get("type") != "tool_result"]
    kept = [block for block in others if block.get("type") not in NOT_STORED]
    last = context[-1] if context else None
    if not kept or said is None or said.role != "user" or last is None:
        return
    if last.get("role") != "user" or content_text(last.get("content")) != said.text:
        return  # the context does not end with the client's message: memory's stays
    read = len(content_blocks(last.get("content")))
    tail = turn[len(turn) - read :] if read else []
    if read != len(kept) or any(block["type"] == "tool_result" for block in tail):
        return
    turn[len(turn) - read :] = [_unmarked(block) for block in others]
