"""Build what is forwarded, within the token budget, and its receipt (pure).

Order of what is sent: the client's prompt; one clearly delimited memory message (pins,
key facts, the evolving summary, chunk summaries newest first, key Q/A pairs); the
window, oldest first; this turn's new messages.

What gives way to the budget is the composition's ``priority``: tiers are filled in that
order while the budget lasts, and the first item of a tier that does not fit ends that
tier, except recall's: its excerpts are tried best first until the budget is used (a
shorter one may fit where a longer did not). With recall, what was made without a model
(fallback summaries and facts) comes after it: recalled words are the better use of the
room. The prompt, the new messages and the window's ``keep_last`` messages are always
sent, even over budget (the upstream then reports the overflow in its own words), but
for those messages' images, which give way to placeholders first (``window_images``).
A tool-calling assistant message and its results are one unit: kept or dropped whole.

Recalled excerpts are shown in conversation order, one line per message with its
speaker, under a line with their date ("[Sat 2024-01-13]") and "…" where messages were
left out; with ``dates``, the block also says today's date and the window's, and each
summary's span.

How each item reads (a person's words always quoted, never instructions): ``block``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

from gateway.memory.archive import Archive
from gateway.memory.block import (
    DATES_HEADER,
    MEMORY_HEADER,
    SECTION_ORDER,
    SECTIONS,
    Count,
    Item,
    block_tokens,
    counts_as_recorded,
    cut_item,
    dates_line,
    item_key,
    lines_add_up,
    memory_items,
    memory_lines,
    recalled_line,
)
from gateway.memory.counting import TOKENS_PER_MESSAGE, TOKENS_PER_REPLY
from gateway.memory.model import Message, Pin, Tiers
from gateway.memory.reconcile import Reconciled
from gateway.memory.tiers.window import (
    newest_groups,
    newest_unit_list,
    without_unanswered_calls,
)
from gateway.memory.window_images import images_within
from gateway.presets import Composition, TierName

Unit = tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class Receipt:
    """What went into a forwarded context: tokens per tier and which items."""

    tiers: dict[str, int]
    window_indexes: tuple[int, ...]
    budget_tokens: int
    summaries: tuple[tuple[int, int], ...] = ()
    pins: tuple[str, ...] = ()
    recalled: tuple[str, ...] = ()  # "12" in this session, "<session>#5" in another
    # Estimated tokens of each section of the memory message (the "memory" tier's parts).
    memory_sections: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    # Of this context's tokens, those the upstream can reuse from what the session
    # forwarded last (``upstream.prompt_cache``); None: not known (no previous context).
    stable: int | None = None

    @property
    def total_tokens(self) -> int:
        return sum(self.tiers.values()) + TOKENS_PER_REPLY

    def header(self) -> str:
        """Compact form for ``X-Memory-Receipt``: ``prompt=12;memory=80;window=340;…``."""
        parts = [f"{tier}={tokens}" for tier, tokens in self.tiers.items()]
        if self.window_indexes:
            parts.append(f"idx={self.window_indexes[0]}-{self.window_indexes[-1]}")
        if self.summaries:
            parts.append("sum=" + ",".join(f"{a}-{b}" for a, b in self.summaries))
        if self.pins:
            parts.append(f"pins={len(self.pins)}")
        if self.recalled:
            parts.append("recalled=" + ",".join(self.recalled))
        if self.stable is not None:
            parts.append(f"stable={self.stable}")
        parts.append(f"budget={self.budget_tokens}")  # last, as it always was
        return ";".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "tiers": dict(self.tiers),
            "total_tokens": self.total_tokens,
            "budget_tokens": self.budget_tokens,
            "window_indexes": list(self.window_indexes),
            "summaries": [{"start": a, "end": b} for a, b in self.summaries],
            "pins": list(self.pins),
            "recalled": list(self.recalled),
            "memory_sections": dict(self.memory_sections),
            "dropped": dict(self.dropped),
            "stable_tokens": self.stable,
        }


@dataclass(frozen=True, slots=True)
class Context:
    messages: tuple[Message, ...]
    receipt: Receipt

    def openai_messages(self) -> list[dict[str, Any]]:
        return [message.to_openai() for message in self.messages]


class Recalled(NamedTuple):
    """A message recalled from the archive, best first; ``session`` is None for this
    session. ``lead_in``: the message a short hit answers, sent with it. ``archive``: the
    one both were found in, which makes each message's line once (``Archive.line``); None:
    made here. (Tuples, like ``Item``: hundreds a request, several times faster to make
    than dataclasses.)"""

    message: Message
    session: str | None = None
    score: float = 0.0
    lead_in: Message | None = None
    archive: Archive | None = None

    @property
    def key(self) -> str:
        return item_key(self.message, self.session)


def _tokens(messages: Sequence[Message]) -> int:
    return sum(message.tokens for message in messages)


def window_units(
    turn: Reconciled, tiers: Tiers, composition: Composition, *, messages: int | None = None
) -> list[Unit]:
    """Candidate window units, newest first, within the window's own limits (its count:
    ``messages`` when given)."""
    window = composition.window
    prior = turn.prior
    if window.after_summarized and tiers.summaries:
        covered = max(s.end for s in tiers.summaries)
        prior = tuple(m for m in prior if not m.index or m.index > covered)
    units = newest_unit_list(
        prior,
        max_messages=window.messages if messages is None else messages,
        max_tokens=window.tokens,
        max_turns=window.turns,
    )
    if turn.new and turn.new[0].role == "tool" and turn.prior and not units:
        # The new messages answer tool calls: the calling assistant comes along whatever
        # the window's limits, even when a summary already covers it (the upstream
        # rejects results without their call).
        units = [next(newest_groups(turn.prior))]
    later = frozenset(m.tool_call_id for m in turn.new if m.role == "tool" and m.tool_call_id)
    answered = (
        without_unanswered_calls(unit, later if n == 0 else frozenset())
        for n, unit in enumerate(units)
    )
    return [unit for unit in answered if unit]


def kept_units(units: Sequence[Unit], keep_last: int, turn: Reconciled) -> int:
    """How many of the newest units are always sent: those that hold the newest
    ``keep_last`` messages, and the call that new tool results answer."""
    keep = messages = 0
    while keep < len(units) and messages < keep_last:
        messages += len(units[keep])
        keep += 1
    if turn.new and turn.new[0].role == "tool" and units and keep == 0:
        keep = 1  # tool results are never sent without the call they answer
    return keep


def rendered_block(
    chosen: list[Item],
    count: Count,
    room: int,
    dropped: dict[str, int],
    *,
    role: str,
    header: str = MEMORY_HEADER,
    dates: str = "",
    always: bool = False,
) -> Message | None:
    """The block as one message within ``room`` by its exact count (the per-item estimate
    can miss by a token at a joint: the item filled last gives way, counted in
    ``dropped``); None when nothing fits. The dates go only with items, unless
    ``always``.

    A count that adds up line by line is not given the whole block, new at every turn,
    but what its lines are known to count (``block_tokens``): the same number."""
    by_lines = lines_add_up(count)
    while chosen or (always and dates):
        lines, pieces = memory_lines(chosen, dates, header, always=always)
        text = "\n".join(lines)
        tokens = block_tokens(lines, pieces, count) if by_lines else count(text)
        tokens += TOKENS_PER_MESSAGE
        if tokens <= room:
            return Message(role=role, content=text, tokens=tokens)
        if not chosen:
            return None
        last = chosen.pop()
        dropped[last.section] = dropped.get(last.section, 0) + 1
    return None


_SECTION = itemgetter(0)  # an ``Item``'s section

# Tiers that give a conversation's gist, which leave ``RecallTier.reserve`` to recall.
_GIST = frozenset({"facts", "summaries", "rolling", "key_qa", "profile"})


def _before_recall(tier: TierName, composition: Composition) -> bool:
    priority = composition.priority
    return "recall" in priority and priority.index(tier) < priority.index("recall")


class Packer:
    """Fills the memory block item by item, counting what each item adds (its text, and
    its section's title when it opens the section)."""

    def __init__(self, count: Count, budget_tokens: int, used: int, overhead: int) -> None:
        self.count = count
        self.budget = budget_tokens
        self.used = used
        self.overhead = overhead  # the block's own header, paid with its first item
        self.chosen: list[Item] = []
        self.sections: set[str] = set()
        self.by_tier: dict[str, int] = {}

    def opening(self, section: str) -> int:
        """What the block's header and the section's title add, if not there yet."""
        cost = 0 if self.chosen else self.overhead
        if section not in self.sections:
            cost += self.count(SECTIONS[section]) + 2
        return cost

    def cost(self, item: Item) -> int:
        return item.tokens + self.opening(item.section)

    def fits(self, cost: int) -> bool:
        return self.used + cost <= self.budget

    def take(self, tier: str, items: Sequence[Item], cost: int) -> None:
        self.used += cost
        self.by_tier[tier] = self.by_tier.get(tier, 0) + cost
        self.chosen.extend(items)
        self.sections.update(map(_SECTION, items))  # (no Python loop: recall's are many)


def fill_recall(
    packer: Packer,
    recalled: Iterable[Recalled],
    shown: set[int],
    composition: Composition,
    budget_tokens: int,
) -> int:
    """Recalled excerpts, best first, while the budget lasts (and the optional caps):
    each hit with the message it answers when it is short, leaving out what the window
    shows and what an earlier hit brought. Returns how many were tried and left out.

    Every hit is weighed, few are taken, so the weighing is plain arithmetic on locals: a
    message's line costs what it was recorded to cost (``Message.line_tokens``, when the
    counter counts alike), else its own token count (the speaker's label and the line
    break take the place of the framing it counts: a token or so more than the line, ~100
    of a 3,000-token budget, and less than a line of many line breaks, each indented),
    plus a header line for a day not shown yet, or a "…" between excerpts of one day; the
    lines are made for what is taken."""
    tier = composition.recall
    assert tier is not None
    room = packer.budget - packer.used
    if tier.share is not None:
        room = min(room, int(tier.share * budget_tokens) - packer.by_tier.get("recall", 0))
    hits_left = tier.hits if tier.hits is not None else -1
    # A day's header line, as long as the longest such line of its section.
    own_header = packer.count("[Sat 2024-01-13]") + 1
    other_header = packer.count("[Sat 2024-01-13, another conversation]") + 1
    block = 0 if packer.chosen else packer.overhead  # the memory block's own header
    titles = {
        name: 0 if name in packer.sections else packer.count(SECTIONS[name]) + 2
        for name in ("recall", "recall_other")
    }
    dates, count = composition.dates, packer.count
    exact = counts_as_recorded(count)  # (a recorded line's count is this one's)
    # A message of this session is its index, and its day the day's number; another
    # session's, the pair of its session and that (no tuple to make for most hits).
    taken: set[Hashable] = set(shown)
    days: set[Hashable] = set()
    picked: list[Item] = []
    used = left_out = missed = 0
    for message, session, _, lead_in, archive in recalled:
        if room - used < _ROOM_WORTH_TRYING or missed >= _MISSES_WORTH_TRYING or not hits_left:
            break
        cost = 0
        lines = []
        for line in (message,) if lead_in is None else (lead_in, message):
            index = line.index
            if session is None:
                key: Hashable = index
                before: Hashable = index - 1
                after: Hashable = index + 1
                day: Hashable = int(line.ts // 86400)
                header = own_header
            else:
                key, before, after = (session, index), (session, index - 1), (session, index + 1)
                day = (session, int(line.ts // 86400))
                header = other_header
            if key in taken:
                continue
            if day not in days:
                cost += header
            elif before not in taken and after not in taken:
                cost += 2  # a "…" line before or after it
            cost += line.line_tokens if exact and line.line_tokens else line.tokens
            lines.append((line, key, day))
        if not lines:
            continue
        section = "recall" if session is None else "recall_other"
        cost += block + titles[section]
        if used + cost > room:
            left_out += 1
            missed += 1
            continue
        used += cost
        block = titles[section] = 0
        for line, key, day in lines:
            taken.add(key)
            days.add(day)
            # The line as its archive keeps it (made once: ``Archive.line``).
            picked.append(
                recalled_line(line, session, dates)
                if archive is None
                else archive.line(line, session, dates, count)
            )
        missed = 0
        hits_left -= 1
    if picked:
        packer.take("recall", picked, used)
    return left_out


def _chosen_keys(chosen: Sequence[Item]) -> tuple[dict[str, tuple[Any, ...]], dict[str, int]]:
    """The keys of the chosen summaries, pins and recalled lines (both recall sections
    as "recall"), in the order chosen; and ``block.section_tokens``. In one pass over what
    a long session's turn chooses (a hundred lines and more)."""
    keys: dict[str, list[Any]] = {"summaries": [], "pins": [], "recall": []}
    tokens: dict[str, int] = {}
    for item in chosen:
        section = item.section
        tokens[section] = tokens.get(section, 0) + item.tokens
        kept = keys.get(_KEYED.get(section, ""))
        if kept is not None:
            kept.append(item.key)
    sections = {section: tokens[section] for section in SECTION_ORDER if section in tokens}
    return {name: tuple(found) for name, found in keys.items()}, sections


# The sections whose items the receipt names, and under which name.
_KEYED = {"summaries": "summaries", "pins": "pins", "recall": "recall", "recall_other": "recall"}


# Below this many tokens of room, no excerpt is worth trying (a line is ~20 tokens);
# once this many excerpts in a row did not fit, the next ones are not tried either.
_ROOM_WORTH_TRYING = 8
_MISSES_WORTH_TRYING = 24


def assemble(  # noqa: C901  (18: its order of filling is read best in one place; to split)
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
    """Every message must carry its token count (``Message.tokens``). ``recalled`` is
    read best first, only as far as the budget needs. ``now`` is the time of the request
    (for the dates line)."""
    fixed = _tokens(turn.prompt) + _tokens(turn.new) + TOKENS_PER_REPLY
    units = window_units(turn, tiers, composition)
    keep = kept_units(units, composition.window.keep_last, turn)
    # Always sent, but not their images past what the budget leaves.
    units = images_within(units, keep, budget_tokens - fixed, count)

    items = memory_items(tiers, pins, composition, count, profile)
    # With recall, fallbacks wait for it: recalled words are the better use of the room.
    deferred: list[tuple[str, Item]] = []
    if composition.recall is not None:
        for name, section in items.items():
            deferred += [(name, item) for item in section if item.fallback]
            items[name] = [item for item in section if not item.fallback]
    # The dates line is written at the end (it names the window's final span); counted
    # in the block's overhead, at its longest.
    dates = dates_line(now, [m for unit in units for m in unit]) if composition.dates else ""
    overhead = count(MEMORY_HEADER) + TOKENS_PER_MESSAGE
    if dates:
        overhead += count(DATES_HEADER) + count(dates) + 3
    packer = Packer(count, budget_tokens, fixed + sum(_tokens(u) for u in units[:keep]), overhead)
    # What the gist tiers ahead of recall leave for it (``RecallTier.reserve``).
    reserved = 0
    if composition.recall is not None and "recall" in composition.priority:
        reserved = int(composition.recall.reserve * budget_tokens)
    window_taken = keep
    dropped: dict[str, int] = {}
    for tier in composition.priority:
        if tier == "window_keep":
            continue  # already counted: always sent
        if tier == "window":
            while window_taken < len(units) and packer.fits(_tokens(units[window_taken])):
                packer.used += _tokens(units[window_taken])
                window_taken += 1
            dropped["window"] = sum(len(u) for u in units[window_taken:])
            continue
        if tier == "recall":
            if composition.recall is not None:
                shown = {m.index for u in units[:window_taken] for m in u if m.index}
                shown |= {m.index for m in turn.new if m.index}
                dropped["recall"] = fill_recall(packer, recalled, shown, composition, budget_tokens)
            continue
        tier_items = items.get(tier, ())
        limit = budget_tokens - (
            reserved if tier in _GIST and _before_recall(tier, composition) else 0
        )
        for n, item in enumerate(tier_items):
            cost = packer.cost(item)
            if packer.used + cost > limit and tier == "rolling":
                # The one evolving summary may be longer than the whole budget (seed 001
                # lets it grow to 7000 tokens): send the part that fits, not nothing.
                cut = cut_item(item, item.tokens - (packer.used + cost - limit), count)
                cost -= item.tokens - cut.tokens
                item = cut
                dropped["rolling_cut"] = 1
            if packer.used + cost > limit or not item.text:
                dropped[tier] = len(tier_items) - n
                break
            packer.take(tier, (item,), cost)
    for name, item in deferred:
        cost = packer.cost(item)
        if packer.fits(cost):
            packer.take(name, (item,), cost)
        else:
            dropped[name] = dropped.get(name, 0) + 1

    chosen = packer.chosen
    window = tuple(m for unit in reversed(units[:window_taken]) for m in unit)
    if dates:
        dates = dates_line(now, window)
    rest = fixed + _tokens(window)
    block = rendered_block(
        chosen, count, budget_tokens - rest, dropped, role=memory_role, dates=dates
    )
    memory = (block,) if block is not None else ()
    memory_tokens = block.tokens if block is not None else 0
    tier_tokens = {"prompt": _tokens(turn.prompt)}
    if chosen:
        tier_tokens["memory"] = memory_tokens
    tier_tokens |= {"window": _tokens(window), "new": _tokens(turn.new)}
    keys, sections = _chosen_keys(chosen)
    receipt = Receipt(
        tiers=tier_tokens,
        window_indexes=tuple(m.index for m in window if m.index),
        budget_tokens=budget_tokens,
        summaries=keys["summaries"],
        pins=keys["pins"],
        recalled=keys["recall"],
        memory_sections=sections,
        dropped={k: v for k, v in dropped.items() if v},
    )
    return Context(messages=turn.prompt + memory + window + turn.new, receipt=receipt)
