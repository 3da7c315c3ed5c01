"""Responses API ``item_reference``s resolved against the stored log (pure).

Notes:
    A client of the Responses API with ``store: true`` (the Vercel AI SDK's default
    provider) sends its earlier answers back as ``{"type": "item_reference", "id": ...}``
    instead of in full: the upstream that stored the response holds the item. Taken for
    nothing, such a history has no assistant message, and every user message in it would
    look new: stored again, and forwarded again, on every turn.

    An answer the gateway recorded keeps the ids of the output items it came as
    (``Message.output_items``). A reference the request carries stands in the message
    list as a *reference* (``reference``), resolved here, before reconciliation, against
    the loaded tail, into the part of the stored answer that item was: its text (its first
    message item; any later one is in that text already), one of its tool calls (a
    function_call item), or nothing (reasoning, a built-in tool's call: no chat form).
    Parts join as ``messages_from_input`` joins items — a call joins the assistant message
    before it — and a message rebuilt whole is the stored one, so a history sent with
    references lines up with the log exactly as the same history sent in full does.

    A resolved reference is never forwarded: the context holds memory's copy of the item,
    or a summary of it. One the tail does not resolve is not memory's to replace: it is
    forwarded as sent (the upstream resolves an item it stored and refuses one it did
    not) and, having no content, never stored. Except where it comes before a resolved one
    in a session whose log begins before its loaded tail: it then names an older item of
    this conversation, which memory holds, and is dropped like a resolved one.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.memory.model import Message

# The output item type of a reference's stand-in (``Message.output_items``).
REFERENCE = "item_reference"


def reference(item_id: str) -> Message:
    """The stand-in for a request's ``item_reference`` to ``item_id``: an assistant
    message (what a reference nearly always names) with no content, until resolved."""
    return Message(role="assistant", output_items=((item_id, REFERENCE, ""),))


def is_reference(message: Message) -> bool:
    items = message.output_items
    return len(items) == 1 and items[0][1] == REFERENCE and message.content is None


# What an item of a stored answer is: the answer, and which part of it the item was
# ("text", a tool call's id, or "" for an item with no chat form).
_Part = tuple[Message, str]


def _parts(tail: Sequence[Message]) -> dict[str, _Part]:
    parts: dict[str, _Part] = {}
    for stored in tail:
        text = False
        for item_id, kind, call_id in stored.output_items:
            if kind == "message" and not text:
                parts[item_id], text = (stored, "text"), True
            else:
                parts[item_id] = (stored, call_id if kind == "function_call" else "")
    return parts


def _rebuilt(stored: Message, part: str) -> Message | None:
    """The message a full item would have made of this part of ``stored``."""
    if part == "text":
        # (None only beside calls: an answer of calls alone has no text to stand for)
        return None if stored.content is None else Message(role="assistant", content=stored.content)
    calls = [c for c in stored.tool_calls or () if part and c.get("id") == part]
    return Message(role="assistant", tool_calls=tuple(calls)) if calls else None


def _joins(message: Message, out: list[Message]) -> bool:
    """Whether ``message`` (only calls) joins the assistant message before it."""
    return (
        bool(out)
        and out[-1].role == "assistant"
        and message.role == "assistant"
        and message.content is None
        and bool(message.tool_calls)
    )


def resolve(
    messages: Sequence[Message], tail: Sequence[Message]
) -> tuple[tuple[Message, ...], frozenset[str]]:
    """``messages`` with their references resolved against the stored ``tail``, and the
    ids of the references that are not to be forwarded (see the module notes)."""
    if not any(is_reference(m) for m in messages):
        return tuple(messages), frozenset()
    parts = _parts(tail)
    older = bool(tail) and tail[0].index > 1  # the log begins before the tail
    out: list[Message] = []
    sources: list[Message | None] = []  # the stored answer each message was rebuilt from
    resolved: set[str] = set()
    unknown: list[str] = []  # unresolved, before any resolved one
    pending: Message | None = None  # an answer whose reasoning came by reference
    for message in messages:
        source = None
        if is_reference(message):
            item_id = message.output_items[0][0]
            found = parts.get(item_id)
            if found is None:
                if not resolved:
                    unknown.append(item_id)
                continue
            resolved.add(item_id)
            source, part = found
            rebuilt = _rebuilt(source, part)
            if rebuilt is None:
                pending = source  # its text or calls may follow in full
                continue
            message = rebuilt
        source, pending = (source or pending) if message.role == "assistant" else None, None
        if _joins(message, out):
            calls = (*(out[-1].tool_calls or ()), *(message.tool_calls or ()))
            out[-1] = Message(role="assistant", content=out[-1].content, tool_calls=calls)
            sources[-1] = sources[-1] or source
        else:
            out.append(message)
            sources.append(source)
    # A message rebuilt whole is the stored one (its output items, its token count).
    kept = tuple(
        s if s is not None and m.same_turn_as(s) else m for m, s in zip(out, sources, strict=True)
    )
    if resolved and older:
        resolved.update(unknown)
    return kept, frozenset(resolved)
