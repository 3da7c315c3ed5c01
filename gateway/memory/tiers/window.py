"""The verbatim window: the newest messages, by count and by tokens (pure).

An assistant message that calls tools and the ``tool`` messages answering it form one
unit: a model given results without the call (or a call without its results) rejects
the request, so the window takes or drops such a unit whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from gateway.memory.model import Message


def newest_groups(messages: Sequence[Message]) -> Iterator[tuple[Message, ...]]:
    """The messages' units, newest first: a tool-calling assistant with its results, or
    one message. Made only as far as they are read: a window of 8 messages reads 8 of a
    64-message stored tail, not all of them.

    A run of tool results belongs to the assistant message just before it when that one
    calls tools, and is a unit of its own otherwise (its call cut off by an earlier
    boundary): ``newest_unit_list`` never starts a window with such a unit.
    """
    end = len(messages)
    while end > 0:
        start = end - 1
        if messages[start].role == "tool":
            while start > 0 and messages[start - 1].role == "tool":
                start -= 1
            before = messages[start - 1] if start > 0 else None
            if before is not None and before.role == "assistant" and before.tool_calls:
                start -= 1
        yield tuple(messages[start:end])
        end = start


def newest_unit_list(
    messages: Sequence[Message],
    *,
    max_messages: int | None,
    max_tokens: int | None = None,
    max_turns: int | None = None,
) -> list[tuple[Message, ...]]:
    """The newest whole units within every given limit, newest first."""
    chosen: list[tuple[Message, ...]] = []
    count = tokens = turns = 0
    for group in newest_groups(messages):
        group_tokens = sum(m.tokens for m in group)
        if max_messages is not None and count + len(group) > max_messages:
            break
        if max_tokens is not None and tokens + group_tokens > max_tokens:
            break
        if max_turns is not None and turns >= max_turns:
            break  # going back in time, a turn is complete once its user message is in
        chosen.append(group)
        count += len(group)
        tokens += group_tokens
        turns += sum(1 for m in group if m.role == "user")
    # Never open the window with orphaned tool results.
    while chosen and chosen[-1][0].role == "tool":
        chosen.pop()
    return chosen


def without_unanswered_calls(
    unit: tuple[Message, ...], answered_later: frozenset[str] = frozenset()
) -> tuple[Message, ...]:
    """The unit, its assistant's tool calls that no result answers taken out.

    A model's calls the application never ran (the user moved on, the app dropped them)
    are stored as they were made. Sent again without their results, every later request
    would be refused ("tool_call_ids did not have response messages"): the session would
    fail at every turn. So a call is forwarded only with its result, in the unit or among
    the request's new messages (``answered_later``, for the newest unit); an assistant
    message left with neither calls nor text is not forwarded at all.
    """
    head = unit[0] if unit else None
    if head is None or head.role != "assistant" or not head.tool_calls:
        return unit
    answered = answered_later | {m.tool_call_id for m in unit[1:] if m.tool_call_id}
    kept = tuple(call for call in head.tool_calls if str(call.get("id")) in answered)
    if len(kept) == len(head.tool_calls):
        return unit
    if not kept and not head.text:
        return unit[1:]
    return (dataclasses.replace(head, tool_calls=kept or None), *unit[1:])


def step_start(index: int, step: int) -> int:
    """The start of the ``step`` of messages ``index`` falls in: 1, step + 1, 2·step + 1…"""
    return index - (index - 1) % step


def anchored(
    units: Sequence[tuple[Message, ...]], target: int, most: int, step: int, keep: int
) -> list[tuple[Message, ...]]:
    """The window (units, newest first, as far as loaded) from its anchor on: the start of
    the ``step`` of messages that holds the oldest unit of the newest ``target`` tokens, so
    that it holds those and less than a step more; where that is past ``most`` tokens (long
    messages), the start of the half step that holds it, and so on. Where what is loaded
    does not reach back to that start (the window's count, not its tokens, is what binds:
    short messages), the next step's start: a step less.

    As messages are added and the oldest unit within ``target`` moves forward, the
    anchor stays where it is until that unit passes into the next step: the window is
    appended to turn after turn and loses a step of messages at once (the only turns whose
    window changes, for a prompt cache). The newest ``keep`` units are kept whatever their
    size, and so are the newest messages without an index (not stored yet: imported this
    turn, an edit's branch); a window of those alone gives no anchor: the newest ``target``.
    """
    within = _fitting(units, target, keep)
    if within <= keep or step <= 1 or units[within - 1][0].index <= 0:
        return list(units[:within])
    oldest = units[within - 1][0].index
    loaded_from = units[-1][0].index
    # Long messages: a step's more may not fit; half a step's may (steps of a step are
    # fixed points too, passed more often).
    while step > 1:
        anchor = step_start(oldest, step)
        if loaded_from > anchor:  # not loaded back to it: the next step's start
            anchor += step
        chosen = _from_anchor(units, anchor)
        if len(chosen) >= max(keep, 1) and _size(chosen) <= most:
            return chosen
        step //= 2
    return list(units[:within])


def _from_anchor(units: Sequence[tuple[Message, ...]], anchor: int) -> list[tuple[Message, ...]]:
    """The newest units down to the one at ``anchor``: those not stored yet, then those
    from ``anchor`` on (a unit starting before it, a call whose result is at it, is not)."""
    n = 0
    while n < len(units) and (units[n][0].index <= 0 or units[n][0].index >= anchor):
        n += 1
    return list(units[:n])


def _fitting(units: Sequence[tuple[Message, ...]], tokens: int, keep: int) -> int:
    """How many of the newest units: the ``keep`` newest, and more while within ``tokens``."""
    n = min(keep, len(units))
    used = _size(units[:n])
    while n < len(units) and used + _size(units[n : n + 1]) <= tokens:
        used += _size(units[n : n + 1])
        n += 1
    return n


def _size(units: Sequence[tuple[Message, ...]]) -> int:
    return sum(m.tokens for unit in units for m in unit)
