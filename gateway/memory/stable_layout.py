"""The cache-stable layout: a context whose beginning stays the same from turn to turn
(pure; ``Composition.stable``, docs/prompt-caching.md).

Providers bill a prompt prefix they saw recently at a fraction of its price, and local
servers skip its prefill: what they reuse is the longest common prefix with the previous
request. ``assemble`` rebuilds one memory message after the prompt every turn, so nothing
after the prompt is reused. Here what changes least comes first:

1. the client's prompt;
2. the **stable memory**: pins, the profile, and the facts and summaries of the messages
   before the window's anchor (``tiers_before``): it changes when the anchor moves, a
   pin is added, or a job lands for what the anchor left behind; within
   ``memory_share`` of the budget, packed against that share alone (not against what
   the window leaves), so that it does not change as the window grows;
3. the **window**, verbatim from its anchor on (``window.anchored``), within
   ``window_share`` of the budget: appended to turn after turn, it loses a whole step of
   messages when it outgrows its share;
4. late, in a message of its own, what is chosen for the new message: the dates (today's,
   and the window's) and the **recalled excerpts**, within ``recall_share`` (and what
   the rest leaves) — the part no cache can hold, kept small;
5. the new messages (new tool results come before the late message: they answer the
   call the window ends with, and nothing may come between a call and its results).

A turn's uncached tokens are then its previous answer, its recalled excerpts and its new
message, except at the turns where the anchor moves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gateway.memory.assemble import (
    Context,
    Packer,
    Recalled,
    Receipt,
    Unit,
    fill_recall,
    kept_units,
    rendered_block,
    window_units,
)
from gateway.memory.block import (
    DATES_HEADER,
    MEMORY_HEADER,
    RECALLED_HEADER,
    Count,
    Item,
    dates_line,
    memory_items,
    section_tokens,
)
from gateway.memory.counting import TOKENS_PER_MESSAGE, TOKENS_PER_REPLY
from gateway.memory.model import Fact, Message, Pin, Tiers
from gateway.memory.reconcile import Reconciled
from gateway.memory.tiers.window import anchored, step_start
from gateway.memory.window_images import images_within
from gateway.presets import Composition, StableLayout

# Where the window's dates are, said from the late message.
_WINDOW_PLACE = "before this one, since the memory above,"


def tiers_before(tiers: Tiers, anchor: int) -> Tiers:
    """The tiers as they stand for the messages before ``anchor``: the summaries and facts
    made of them alone, a fact superseded only by another of them (and the one evolving
    summary, as it stands). (What the window shows verbatim needs no summary; and a job
    landing for it must not change the memory.)

    Kept with the tiers value (``Tiers.derived``): the same anchor finds it again while
    the stored tiers are unchanged, with the items made of it (``block.tier_items``)."""
    key = ("before", anchor)
    found: Tiers | None = tiers.derived.get(key)
    if found is not None:
        return found
    facts = [fact for fact in tiers.facts if fact.end < anchor]
    newest: dict[str, int] = {fact.key: n for n, fact in enumerate(facts) if fact.key}
    before = Tiers(
        version=tiers.version,
        summaries=tuple(s for s in tiers.summaries if s.end < anchor),
        # The one evolving summary has no version as of the anchor, and is all a seed
        # preset remembers of what came before its window: shown as it stands (it changes
        # when its job lands), never left out for reaching past the anchor.
        rolling=tiers.rolling,
        key_qa=tiers.key_qa,
        facts=tuple(_current(fact, n, newest) for n, fact in enumerate(facts)),
        facts_end=min(tiers.facts_end, anchor - 1),
    )
    tiers.derived.put(key, before)
    return before


def _current(fact: Fact, n: int, newest: Mapping[str, int]) -> Fact:
    superseded = bool(fact.key) and newest[fact.key] != n
    return fact if fact.superseded == superseded else replace(fact, superseded=superseded)


def stable_window(
    turn: Reconciled,
    tiers: Tiers,
    composition: Composition,
    budget: int,
    most: int,
    *,
    room: int,
    count: Count,
) -> list[Unit]:
    """The window's units, newest first: about ``window_share`` of the budget and less
    than a step more, within ``most`` tokens and the layout's count, from the anchor on;
    the newest ``keep_last`` messages always, their images within ``room`` tokens
    (``window_images``)."""
    layout = composition.stable
    assert layout is not None
    units = window_units(turn, tiers, composition, messages=layout.window_messages)
    keep = kept_units(units, composition.window.keep_last, turn)
    units = images_within(units, keep, room, count)
    target = min(int(layout.window_share * budget), most)
    return anchored(units, target, most, layout.step, keep)


def _tokens(messages: Sequence[Message]) -> int:
    return sum(message.tokens for message in messages)


def _stable_memory(
    items: dict[str, Sequence[Item]],
    composition: Composition,
    count: Count,
    room: int,
    dropped: dict[str, int],
) -> list[Item]:
    """The stable memory's items, in the composition's priority, within ``room``; what was
    made without a model last (with recall, recalled words are the better use)."""
    packer = Packer(count, room, 0, count(MEMORY_HEADER) + TOKENS_PER_MESSAGE)
    order = [tier for tier in composition.priority if tier in items]
    for fallback in (False, True):
        for tier in order:
            tier_items = [item for item in items[tier] if item.fallback == fallback]
            for n, item in enumerate(tier_items):
                cost = packer.cost(item)
                if not packer.fits(cost) or not item.text:
                    dropped[tier] = dropped.get(tier, 0) + len(tier_items) - n
                    break
                packer.take(tier, (item,), cost)
    return packer.chosen


def assemble_stable(
    turn: Reconciled,
    *,
    tiers: Tiers,
    pins: Sequence[Pin],
    composition: Composition,
    budget_tokens: int,
    memory_role: str,
    count: Count,
    recalled: Iterable[Recalled] = (),
    profile: Mapping[str, Any] | None = None,
    now: float = 0.0,
) -> Context:
    """``assemble``'s contract, in the cache-stable order (see the module's text)."""
    layout: StableLayout | None = composition.stable
    assert layout is not None
    dropped: dict[str, int] = {}
    fixed = _tokens(turn.prompt) + _tokens(turn.new) + TOKENS_PER_REPLY
    memory_room = int(layout.memory_share * budget_tokens)
    recall_room = int(layout.recall_share * budget_tokens) if composition.recall else 0
    most = budget_tokens - fixed - memory_room - recall_room
    units = stable_window(
        turn, tiers, composition, budget_tokens, most, room=budget_tokens - fixed, count=count
    )
    window = tuple(m for unit in reversed(units) for m in unit)
    anchor = window[0].index if window and window[0].index else turn_end(turn) + 1
    used = fixed + _tokens(window)

    # The memory is of what came before the start of the anchor's memory step.
    before = tiers_before(tiers, step_start(anchor, layout.memory_step))
    items = memory_items(before, pins, composition, count, profile)
    room = min(memory_room, budget_tokens - used)
    chosen = _stable_memory(items, composition, count, room, dropped)
    memory = rendered_block(chosen, count, budget_tokens - used, dropped, role=memory_role)
    if memory is None:
        chosen = []
    used += memory.tokens if memory is not None else 0

    # Late: the dates and the excerpts chosen for this message.
    dates = dates_line(now, window, _WINDOW_PLACE) if composition.dates else ""
    late_room = min(budget_tokens - used, int(layout.recall_share * budget_tokens))
    overhead = count(RECALLED_HEADER) + TOKENS_PER_MESSAGE
    if dates:
        overhead += count(DATES_HEADER) + count(dates) + 3
    picked: list[Item] = []
    if composition.recall is not None and late_room > overhead:
        packer = Packer(count, late_room, 0, overhead)
        shown = {m.index for m in window if m.index} | {m.index for m in turn.new if m.index}
        dropped["recall"] = fill_recall(packer, recalled, shown, composition, late_room)
        picked = packer.chosen
    late = None
    if picked or dates:
        late = rendered_block(
            picked,
            count,
            late_room,
            dropped,
            role=memory_role,
            header=RECALLED_HEADER,
            dates=dates,
            always=True,
        )
        if late is None:
            picked = []

    tier_tokens = {"prompt": _tokens(turn.prompt)}
    if memory is not None:
        tier_tokens["memory"] = memory.tokens
    tier_tokens["window"] = _tokens(window)
    if late is not None:
        tier_tokens["recall"] = late.tokens
    tier_tokens["new"] = _tokens(turn.new)
    receipt = Receipt(
        tiers=tier_tokens,
        window_indexes=tuple(m.index for m in window if m.index),
        budget_tokens=budget_tokens,
        summaries=tuple(item.key for item in chosen if item.section == "summaries"),
        pins=tuple(item.key for item in chosen if item.section == "pins"),
        recalled=tuple(item.key for item in picked),
        # The memory message's sections only: the late message is a tier of its own.
        memory_sections=section_tokens(chosen),
        dropped={k: v for k, v in dropped.items() if v},
    )
    blocks = (memory,) if memory is not None else ()
    after = (late,) if late is not None else ()
    # Tool results answer the call the window ends with: nothing may come between them
    # (OpenAI refuses it), so the late message follows them.
    results = _leading_results(turn.new)
    new = turn.new[:results] + after + turn.new[results:]
    return Context(messages=turn.prompt + blocks + window + new, receipt=receipt)


def _leading_results(new: Sequence[Message]) -> int:
    """How many of the new messages are tool results before any other."""
    n = 0
    while n < len(new) and new[n].role == "tool":
        n += 1
    return n


def turn_end(turn: Reconciled) -> int:
    """The index of the last stored message before the new ones (0: none)."""
    indexes = [m.index for m in turn.prior if m.index]
    return max(indexes) if indexes else 0
