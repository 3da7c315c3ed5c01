"""Responses API items ⇄ chat-format messages (pure).

Memory keeps chat-format ``Message``s whichever API a turn came through. The mapping:

    message item (user/system/developer/assistant)  ⇄  a message of that role
        input_text / output_text parts               ⇄  text parts (an assistant's: one string)
        refusal parts                                ⇄  refusal parts
        input_image with an image_url                ⇄  image_url parts
        input_file                                   ⇄  file parts
    function_call items (call_id, name, arguments)   ⇄  the tool_calls of an assistant message
    function_call_output (call_id, output)           ⇄  a tool message (tool_call_id)

Consecutive function calls (parallel calls), and calls right after an assistant message,
make one assistant message, so a call and its output stay together as chat keeps them.

Notes:
    Items of other types (reasoning, built-in tool calls, ...) have no chat form: they
    are forwarded but never stored. Each travels with the message it preceded in the
    request (its *anchor*) and goes out right before that message again if the context
    still holds it; items after the last message go out at the end. Content parts of a
    type the mapping does not know pass both ways unchanged.

    An ``item_reference`` names an item the upstream stored, often an answer memory
    recorded (the Vercel AI SDK sends its earlier answers so with ``store: true``). It is
    both: a stand-in in the message list (``memory.references.reference``), which
    reconciliation resolves to the stored answer's part when the item is one memory
    recorded, and a passenger, forwarded only when it was not resolved (``forwarded``'s
    ``resolved``). A stand-in is nobody's anchor and joins no call: what it stands for is
    known only once the session is loaded (``memory.references.resolve`` joins then).
    An answer's output item ids are kept with it (``message_from_output``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidRequest
from gateway.memory.model import Message, OutputItem, content_text
from gateway.memory.references import REFERENCE, reference

MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})
# Items that become messages; every other type is a passenger (forwarded, not stored).
STORED_TYPES = frozenset({"message", "function_call", "function_call_output"})

# Which message a passenger travels with: ("call", call id), ("output", call id) or
# ("message", role, text).
Anchor = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Converted:
    """A request's ``input`` as messages, and the items that are only forwarded."""

    messages: tuple[Message, ...]
    # (anchor, items): the items go right before the anchored message; None: at the end.
    passengers: tuple[tuple[Anchor | None, tuple[dict[str, Any], ...]], ...] = ()
    # The input item each message was made from (the first, for function calls joined
    # to the assistant message before them): errors name the client's own item.
    origins: tuple[int, ...] = ()

    def item(self, i: int) -> str:
        """Where message ``i`` came from: its input item (``input`` for a string)."""
        return f"input.{self.origins[i]}" if i < len(self.origins) else "input"

    def field(self, i: int, path: str) -> str:
        """Message ``i``'s field ``path`` (chat terms) as its input item's: an image URL
        is the part's ``image_url`` string, not an object's ``url``."""
        if path.endswith("image_url.url"):
            path = path.removesuffix(".url")
        item = self.item(i)
        return f"{item}.{path}" if item != "input" else item


def _invalid(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param)


def _string(item: dict[str, Any], field: str, at: str, *, required: bool = True) -> str | None:
    value = item.get(field)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        raise _invalid(f"{at}.{field}", "must be a non-empty string")
    return value


def _chat_part(part: Any, at: str) -> dict[str, Any]:
    """One Responses content part in chat terms (unknown types unchanged)."""
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise _invalid(at, "content parts must be objects with a string type")
    kind = part["type"]
    if kind in ("input_text", "output_text", "text"):
        if not isinstance(part.get("text"), str):
            raise _invalid(f"{at}.text", "must be a string")
        return {"type": "text", "text": part["text"]}
    if kind == "refusal":
        if not isinstance(part.get("refusal"), str):
            raise _invalid(f"{at}.refusal", "must be a string")
        return {"type": "refusal", "refusal": part["refusal"]}
    if kind == "input_image" and part.get("image_url") is not None:
        if not isinstance(part["image_url"], str):
            raise _invalid(f"{at}.image_url", "must be a string")
        image: dict[str, Any] = {"url": part["image_url"]}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file" and part.get("file_url") is None:
        file = {k: part[k] for k in ("file_id", "file_data", "filename") if k in part}
        if not all(isinstance(value, str) for value in file.values()):
            raise _invalid(at, "input_file fields must be strings")
        return {"type": "file", "file": file}
    for field in ("text", "refusal"):  # read by token counting, recall and summaries
        if field in part and not isinstance(part[field], str):
            raise _invalid(f"{at}.{field}", "must be a string")
    return dict(part)


def _chat_content(content: Any, role: str, at: str) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid(at, "must be a string or an array of content parts")
    parts = [_chat_part(part, f"{at}.{i}") for i, part in enumerate(content)]
    if role == "assistant" and all(part["type"] == "text" for part in parts):
        # As a recorded answer is kept: one string (a resent history then matches it).
        return "".join(part["text"] for part in parts)
    return parts


def _call(item: dict[str, Any], at: str) -> dict[str, Any]:
    call_id = _string(item, "call_id", at)
    name = _string(item, "name", at)
    arguments = item.get("arguments", "")
    if not isinstance(arguments, str):
        raise _invalid(f"{at}.arguments", "must be a string")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _output(item: dict[str, Any], at: str) -> Message:
    call_id = _string(item, "call_id", at)
    output = item.get("output")
    if output is None:
        raise _invalid(f"{at}.output", "required")
    return Message(
        role="tool", content=_chat_content(output, "tool", f"{at}.output"), tool_call_id=call_id
    )


def anchor_of(message: Message | dict[str, Any]) -> Anchor:
    """The key a passenger finds its message by, in the request or in the context."""
    data = message.to_openai() if isinstance(message, Message) else message
    calls = data.get("tool_calls")
    if calls:
        return ("call", str(calls[0].get("id", "")))
    if data.get("role") == "tool":
        return ("output", str(data.get("tool_call_id", "")))
    return ("message", str(data.get("role", "")), content_text(data.get("content")))


def _item_type(item: dict[str, Any]) -> Any:
    # A message item may leave out its type (the SDKs' EasyInputMessage).
    return item.get("type", "message" if "role" in item else None)


def check_function_calls(value: Any) -> None:
    """Every function_call item of ``input`` has a function_call_output after it, and a
    call_id no other function_call of ``input`` has (400 naming the item).

    Stored, an unanswered or repeated call would be sent again on every later turn, and
    OpenAI refuses such a history ("No tool output found for function call ...").
    Calls memory holds are not in ``input``: an output sent alone answers one of them.
    Run after ``messages_from_input``, which checked each item's shape.
    """
    if not isinstance(value, list):
        return
    calls: dict[str, int] = {}  # call_id -> position of its function_call
    unanswered: dict[str, int] = {}  # the same, in input order, until an output answers
    for i, item in enumerate(value):
        kind = _item_type(item)
        if kind == "function_call":
            call_id = item["call_id"]
            if call_id in calls:
                first = f"input.{calls[call_id]}"
                raise _invalid(
                    f"input.{i}", f"call_id {call_id!r} is already the call_id of {first}"
                )
            calls[call_id] = unanswered[call_id] = i
        elif kind == "function_call_output":
            unanswered.pop(item["call_id"], None)
    if unanswered:
        call_id, position = next(iter(unanswered.items()))
        raise _invalid(
            f"input.{position}",
            f"function_call {call_id!r} has no function_call_output after it",
        )


def messages_from_input(value: Any) -> Converted:
    """A Responses ``input`` as chat-format messages (400 for a shape memory cannot keep)."""
    if isinstance(value, str):
        return Converted((Message(role="user", content=value),))
    if not isinstance(value, list):
        raise _invalid("input", "must be a string or an array of input items")
    messages: list[Message] = []
    origins: list[int] = []
    waiting: list[dict[str, Any]] = []  # passengers not yet anchored
    anchored: list[tuple[int, tuple[dict[str, Any], ...]]] = []
    joinable = False  # the last message is an assistant's a call may join
    for i, item in enumerate(value):
        at = f"input.{i}"
        if not isinstance(item, dict):
            raise _invalid(at, "must be an object")
        kind = _item_type(item)
        if not isinstance(kind, str):
            raise _invalid(f"{at}.type", "must be a string")
        if kind == REFERENCE:
            waiting.append(item)  # forwarded before the next message, unless resolved
            messages.append(reference(_string(item, "id", at) or ""))
            origins.append(i)
            joinable = False
            continue
        if kind not in STORED_TYPES:
            waiting.append(item)
            continue
        if kind == "function_call":
            call = _call(item, at)
            if joinable:
                last = messages[-1]
                calls = (*(last.tool_calls or ()), call)
                messages[-1] = Message(role="assistant", content=last.content, tool_calls=calls)
            else:
                messages.append(Message(role="assistant", content=None, tool_calls=(call,)))
                origins.append(i)
            joinable = True
        elif kind == "function_call_output":
            messages.append(_output(item, at))
            origins.append(i)
            joinable = False
        else:
            role = item.get("role")
            if not isinstance(role, str) or role not in MESSAGE_ROLES:
                raise _invalid(f"{at}.role", f"must be one of {', '.join(sorted(MESSAGE_ROLES))}")
            content = _chat_content(item.get("content"), role, f"{at}.content")
            messages.append(Message(role=role, content=content))
            origins.append(i)
            joinable = role == "assistant"
        if waiting:
            anchored.append((len(messages) - 1, tuple(waiting)))
            waiting = []
    passengers: list[tuple[Anchor | None, tuple[dict[str, Any], ...]]] = [
        (anchor_of(messages[position]), items) for position, items in anchored
    ]
    if waiting:
        passengers.append((None, tuple(waiting)))
    return Converted(tuple(messages), tuple(passengers), tuple(origins))


def _response_part(part: Any, role: str) -> Any:
    if not isinstance(part, dict):
        return part
    kind = part.get("type")
    if kind == "text":
        if role == "assistant":
            return {"type": "output_text", "text": part.get("text", ""), "annotations": []}
        return {"type": "input_text", "text": part.get("text", "")}
    if kind == "refusal" and role != "assistant":
        return {"type": "input_text", "text": part.get("refusal", "")}
    if kind == "image_url" and isinstance(part.get("image_url"), dict):
        image = part["image_url"]
        out = {
            "type": "input_image",
            "image_url": image.get("url"),
            "detail": image.get("detail", "auto"),
        }
        return out
    if kind == "file" and isinstance(part.get("file"), dict):
        return {"type": "input_file", **part["file"]}
    return part


def _message_item(role: str, content: Any) -> dict[str, Any]:
    if isinstance(content, list):
        parts = [_response_part(part, role) for part in content]
    else:
        text = content if isinstance(content, str) else content_text(content)
        kind = "output_text" if role == "assistant" else "input_text"
        part: dict[str, Any] = {"type": kind, "text": text}
        if role == "assistant":
            part["annotations"] = []
        parts = [part]
    return {"type": "message", "role": role, "content": parts}


def _items_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    role = message.get("role")
    content = message.get("content")
    if role == "tool":
        output = content if isinstance(content, str) else content_text(content)
        return [
            {
                "type": "function_call_output",
                "call_id": message.get("tool_call_id"),
                "output": output,
            }
        ]
    if role == "function":  # chat's legacy function result: no Responses form
        name = message.get("name") or "function"
        return [_message_item("user", f"[result of {name}]\n{content_text(content)}")]
    items = []
    calls = message.get("tool_calls") or ()
    if not calls or content_text(content):
        items.append(_message_item(str(role), content))
    for call in calls:
        function = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments", ""),
            }
        )
    return items


def _unresolved(
    passengers: Sequence[tuple[Anchor | None, tuple[dict[str, Any], ...]]],
    resolved: frozenset[str],
) -> list[tuple[Anchor | None, tuple[dict[str, Any], ...]]]:
    """The passengers less the references memory resolved (its context holds those)."""
    kept = []
    for anchor, items in passengers:
        riders = tuple(
            item
            for item in items
            if not (_item_type(item) == REFERENCE and item.get("id") in resolved)
        )
        kept.append((anchor, riders))
    return kept


def items_from_messages(
    messages: Sequence[dict[str, Any]],
    passengers: Sequence[tuple[Anchor | None, tuple[dict[str, Any], ...]]] = (),
    resolved: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """A context of chat-format messages as Responses input items, with the request's
    passengers before the messages they preceded (dropped if their message is not sent),
    but for the references in ``resolved``."""
    if resolved:
        passengers = _unresolved(passengers, resolved)
    waiting = {anchor: items for anchor, items in passengers if anchor is not None}
    items: list[dict[str, Any]] = []
    for message in messages:
        if waiting:
            riders = waiting.pop(anchor_of(message), None)
            if riders:
                items += riders
        items += _items_of(message)
    for anchor, riders in passengers:
        if anchor is None:
            items += riders
    return items


def _output_item(item: dict[str, Any]) -> OutputItem | None:
    """An output item as the answer keeps it (``Message.output_items``), if it has an id."""
    item_id, kind, call_id = item.get("id"), item.get("type"), item.get("call_id")
    if not isinstance(item_id, str) or not item_id or not isinstance(kind, str):
        return None
    return item_id, kind, call_id if kind == "function_call" and isinstance(call_id, str) else ""


def message_from_output(output: Any) -> Message | None:
    """A response's ``output`` as the assistant's message: its message items' text and
    its function calls, with the ids of all its items (a client's later
    ``item_reference`` names one); None when it holds neither text nor calls (or is no
    list)."""
    if not isinstance(output, list):
        return None
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    items: list[OutputItem] = []
    found = False
    for item in output:
        if not isinstance(item, dict):
            continue
        kept = _output_item(item)
        if kept is not None:
            items.append(kept)
        kind = item.get("type")
        if kind == "message" and item.get("role", "assistant") == "assistant":
            found = True
            for part in item.get("content") or ():
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "output_text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                    texts.append(part["refusal"])
        elif kind == "function_call":
            name, arguments = item.get("name"), item.get("arguments", "")
            call_id = item.get("call_id")
            if isinstance(call_id, str) and isinstance(name, str) and isinstance(arguments, str):
                found = True
                function = {"name": name, "arguments": arguments}
                calls.append({"id": call_id, "type": "function", "function": function})
    if not found:
        return None
    text = "".join(texts)
    return Message(
        role="assistant",
        content=text if text or not calls else None,
        tool_calls=tuple(calls) or None,
        output_items=tuple(items),
    )
