"""Anthropic Messages stream events, as an upstream sends them, for the watch's and the
relay's tests: the pieces of an answer (a text block, a tool call's start and its input
in pieces) and its end."""

from __future__ import annotations

import json
from typing import Any


def event(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


def text_block(text: str, index: int = 0) -> bytes:
    return (
        event("content_block_start", index=index, content_block={"type": "text", "text": ""})
        + event("content_block_delta", index=index, delta={"type": "text_delta", "text": text})
        + event("content_block_stop", index=index)
    )


START = event(
    "message_start",
    message={"id": "msg_1", "type": "message", "role": "assistant", "content": [],
             "model": "m", "stop_reason": None, "usage": {"input_tokens": 5, "output_tokens": 1}},
)  # fmt: skip
CALL = event(
    "content_block_start",
    index=0,
    content_block={"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
)
STOP = event("message_stop")


def delta(reason: Any) -> bytes:
    return event("message_delta", delta={"stop_reason": reason}, usage={"output_tokens": 3})


def piece(json_text: str, index: int = 0) -> bytes:
    """A piece of a tool call's input (``input_json_delta``)."""
    return event(
        "content_block_delta",
        index=index,
        delta={"type": "input_json_delta", "partial_json": json_text},
    )
