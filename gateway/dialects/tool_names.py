"""Function names, held to OpenAI's rule: 1 to 64 letters, digits, underscores or dashes.

OpenAI refuses a request whose tools, or whose history's tool calls, name a function
otherwise (``Invalid 'messages[9].tool_calls[0].function.name': string does not match
pattern``). Refused here, a tool's bad name costs no upstream call; a history's bad name
is never stored, where it would have been sent again, and refused, on every later turn.

Only what the client sends is checked, and of a turn's history only the messages memory
is about to keep (``recorded_bad_name``): a call already stored came from an upstream's
answer (a model may name a tool it was never given), and a client sending it back with
its history must not find its session refused from then on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidRequest
from gateway.memory.model import PROMPT_ROLES, Message

FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# Tool kinds whose definitions (and calls) carry a name the model calls them by.
_NAMED_KINDS = ("function", "custom")


def is_function_name(value: Any) -> bool:
    return isinstance(value, str) and FUNCTION_NAME.fullmatch(value) is not None


def name_error(param: str, name: Any) -> InvalidRequest:
    """400 as OpenAI's own: ``invalid_value``, naming the field."""
    shown = repr(name) if isinstance(name, str) and len(name) <= 100 else "the value"
    return InvalidRequest(
        f"{param}: {shown} is not a function name: 1 to 64 letters, digits, underscores "
        "or dashes (^[a-zA-Z0-9_-]{1,64}$)",
        param=param,
        code="invalid_value",
    )


def _check_named(param: str, holder: Any) -> None:
    if isinstance(holder, dict) and "name" in holder and not is_function_name(holder["name"]):
        raise name_error(f"{param}.name", holder["name"])


def check_chat_tools(body: dict[str, Any]) -> None:
    """The names of a chat request's tools (``tools.0.function.name``) and legacy
    ``functions`` (``functions.0.name``). Other shapes are left to the upstream."""
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in _NAMED_KINDS:
            _check_named(f"tools.{i}.{kind}", tool.get(kind))
    functions = body.get("functions")
    for i, function in enumerate(functions if isinstance(functions, list) else ()):
        _check_named(f"functions.{i}", function)


def check_responses_tools(body: dict[str, Any]) -> None:
    """The names of a Responses request's function and custom tools (``tools.0.name``);
    the built-in tools (web_search, mcp, ...) have none."""
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        if isinstance(tool, dict) and tool.get("type") in _NAMED_KINDS:
            _check_named(f"tools.{i}", tool)


@dataclass(frozen=True, slots=True)
class BadName:
    """A function name memory must not keep, and where the client sent it."""

    position: int  # the message's place in the request
    call: int | None  # which of its tool calls; None: the message's own (a function result)
    path: str  # within the message, in chat terms: "tool_calls.0.function.name", "name"
    name: Any


def _bad_in(message: Message, position: int) -> BadName | None:
    if message.role == "function" and not is_function_name(message.name):
        return BadName(position, None, "name", message.name)
    for j, call in enumerate(message.tool_calls or ()):
        kind = call.get("type", "function")
        named = call.get(kind) if kind in _NAMED_KINDS else None
        if isinstance(named, dict) and "name" in named and not is_function_name(named["name"]):
            return BadName(position, j, f"tool_calls.{j}.{kind}.name", named["name"])
    return None


def recorded_bad_name(messages: Sequence[Message], recorded: Sequence[Message]) -> BadName | None:
    """The first bad function name in ``recorded``, the end of the request's ``messages``
    (prompt roles aside) that memory is about to keep (``Reconciled.to_record``); None
    when all are good."""
    conversation = [i for i, m in enumerate(messages) if m.role not in PROMPT_ROLES]
    offset = len(conversation) - len(recorded)
    for k, message in enumerate(recorded):
        position = conversation[offset + k] if offset >= 0 else k
        bad = _bad_in(message, position)
        if bad is not None:
            return bad
    return None
