"""Which messages of a request are new (pure).

Notes:
    Clients send their whole history (most SDK apps) or only the new message. We take the
    new messages to be those after the request's last assistant message: a user message,
    or the tool results answering the stored assistant's tool calls. System and developer
    messages are the client's prompt: kept at the top of what is forwarded, never stored.

    The history the client sent before its new messages is matched against the stored
    tail by content:
    * it ends with what we stored last → nothing to import (the usual resend);
    * it runs past what we stored (a turn was missed while Redis was down) → the missing
      messages are imported before the new ones, so nothing the client saw is lost;
    * the session is empty → the whole history is imported (a conversation that existed
      before the gateway was put in front of it);
    * it lines up with the stored log and then departs from it at a user message (the
      user edited an earlier message and resent the conversation up to it) → a new
      branch starts there: the stored messages after that point are abandoned (kept
      aside by the store, no longer part of the conversation) and the client's messages
      from that point on are recorded;
    * it does not match otherwise → the store wins and only the new messages are
      recorded.

    An edit must not be mistaken for an ordinary client, which never loses anything, so
    the evidence asked for is strict (see ``_edit_of``): the history agrees with the
    stored log over its whole length from the log's first message, or over at least
    ``_ALIGN`` messages, right before the departure; the departure is a user message
    replacing a stored user message, inside the loaded tail; no summary (nor key Q/A)
    covers the abandoned messages and no pin comes from them (facts read from them are
    redone instead, see ``branches``). A client that sends only its new message, a
    sliding window that ends where the log ends, a missed turn, a retry and a regenerate
    are matched first and never reach it. An edit that fails these tests (of the very
    first message, before the loaded tail, into summarized messages, of an assistant
    message) keeps the rule above: the store wins.

    A turn stored without an answer (an import that ended on a user message) and sent
    again is a retry: its stored messages are this turn's, and only the answer is added.

    A regenerate resends the last stored user turn without the answer we stored for it.
    It is recognised only when the request's history lines up with what was stored before
    that turn — for a client that sends single messages a repeated "continue" is a new
    turn, not a regenerate. The stored answer is then replaced, not duplicated.

    Concurrency: a plain new turn may land after any other turn (turns are appended whole).
    Requests sent at once with the same history and different new messages (a client
    fanning out questions, two tabs) look like edits of one another: an edit may abandon
    only messages recorded a moment before the request arrived (``edits_before``), and a
    plan made again because another turn landed meanwhile never abandons it.
    A plan that relies on the stored tail as it was loaded — an import, a retry, a
    regenerate, an edit — carries ``expected_count``: it is recorded only if the log
    still has that length, and otherwise reconciled again against the newer tail, so two
    requests that both saw the same missing history import it once.

    A Responses API history may name earlier answers by ``item_reference``: those are
    resolved against the loaded tail first (``references``), so that it lines up as the
    same history sent in full does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gateway.memory.model import PROMPT_ROLES, Message, SessionState
from gateway.memory.references import resolve

# How many messages must agree for two histories to count as the same conversation.
_ALIGN = 4


@dataclass(frozen=True, slots=True)
class Reconciled:
    """A request split into prompt, what is already known, and what this turn adds."""

    prompt: tuple[Message, ...]
    prior: tuple[Message, ...]  # the conversation before this turn, oldest first
    to_record: tuple[Message, ...]  # messages to append before the answer
    new: tuple[Message, ...]  # this turn's new messages (stored ones keep their index)
    truncate_to: int | None = None  # regenerate: stored messages after this index go
    # An edit: stored messages after this index are abandoned (the store keeps them aside).
    branch_from: int | None = None
    # The stored message count this plan relies on; None when it may land after any turn.
    expected_count: int | None = None
    # The request's item references not to forward: memory holds their items.
    resolved: frozenset[str] = frozenset()


def _same(a: Sequence[Message], b: Sequence[Message]) -> bool:
    return len(a) == len(b) and all(x.same_turn_as(y) for x, y in zip(a, b, strict=True))


def _tails_agree(history: Sequence[Message], stored: Sequence[Message]) -> bool:
    n = min(len(history), len(stored), _ALIGN)
    return n > 0 and _same(history[len(history) - n :], stored[len(stored) - n :])


def _regenerate_of(
    history: Sequence[Message], new: Sequence[Message], state: SessionState
) -> int | None:
    """The number of stored messages to keep if this request regenerates the last answer."""
    stored = state.tail
    k = len(new)
    if len(stored) < k + 1 or stored[-1].role != "assistant":
        return None
    if not _same(stored[-1 - k : -1], new):
        return None
    kept = state.message_count - 1 - k
    before = stored[: len(stored) - 1 - k]
    if not history:
        return kept if kept == 0 else None
    return kept if _tails_agree(history, before) else None


def _missing_from_store(history: Sequence[Message], stored: Sequence[Message]) -> int | None:
    """Position in ``history`` after which the client has messages we did not store."""
    last = stored[-1]
    for position in range(len(history) - 1, -1, -1):
        if history[position].same_turn_as(last) and _tails_agree(history[: position + 1], stored):
            return position + 1
    return None


def _derived_end(state: SessionState) -> int:
    """The last stored message something lasting was made from: summaries, the rolling
    summary (key Q/A pairs are written with it) and pins. Facts are not counted: the
    record of an edit has those read from abandoned messages redone (``branches``)."""
    tiers = state.tiers
    ends = [s.end for s in tiers.summaries]
    ends += [p.source_index or 0 for p in state.pins]
    if tiers.rolling is not None:
        ends.append(tiers.rolling.end)
    return max(ends, default=0)


def _departs(replacing: Message, replaced: Message) -> bool:
    return (
        replacing.role == "user"
        and replaced.role == "user"
        and not replacing.same_turn_as(replaced)
    )


def _edit_of(
    history: Sequence[Message], new: Sequence[Message], state: SessionState
) -> tuple[int, int] | None:
    """Where this request branches off the stored log, if it is an edit: (how many of
    ``history`` are kept as they are stored, the tail position of the first abandoned
    message). ``None`` when the evidence is not there (see the module notes)."""
    stored = state.tail
    if not history or not stored or _tails_agree(history, stored):
        return None
    derived = _derived_end(state)
    # Resent up to the edited message, which is this request's new user message: the
    # history's end lines up with the stored messages before the one it replaces (over
    # ``_ALIGN`` messages, or all of them from the log's first). The latest such place
    # abandons the least.
    h = len(history)
    if new and new[0].role == "user":
        for at in range(len(stored) - 1, 0, -1):
            if stored[at - 1].index < derived or not _departs(new[0], stored[at]):
                continue
            n = min(h, at)
            if not _same(history[h - n :], stored[at - n : at]):
                continue
            if n >= _ALIGN or (stored[0].index == 1 and n == h == at):
                return h, at
    # Resent with the edited message inside the history (the client went on after its
    # edit): only for a client that sends the whole conversation, where a message's place
    # in the history is its stored index less one, and after several agreeing messages.
    for at, kept in enumerate(stored):
        position = kept.index - 1
        if position >= h:
            return None
        if history[position].same_turn_as(kept):
            continue
        if at < _ALIGN or stored[at - 1].index < derived or not _departs(history[position], kept):
            return None
        return position, at
    return None


def reconcile(
    messages: Sequence[Message], state: SessionState, *, edits_before: float | None = math.inf
) -> Reconciled:
    """This request's plan. An edit may abandon stored messages only if the newest was
    recorded before ``edits_before`` (a time; ``None``: no edit at all)."""
    messages, resolved = resolve(messages, state.tail)
    plan = _plan(messages, state, edits_before)
    return replace(plan, resolved=resolved) if resolved else plan


def _plan(
    messages: Sequence[Message], state: SessionState, edits_before: float | None
) -> Reconciled:
    prompt = tuple(m for m in messages if m.role in PROMPT_ROLES)
    conversation = [m for m in messages if m.role not in PROMPT_ROLES]
    last_assistant = max(
        (i for i, m in enumerate(conversation) if m.role == "assistant"), default=-1
    )
    history = conversation[: last_assistant + 1]
    new = tuple(conversation[last_assistant + 1 :])
    stored = state.tail

    kept = _regenerate_of(history, new, state)
    if kept is not None:
        k = len(new)
        return Reconciled(
            prompt=prompt,
            prior=stored[: len(stored) - 1 - k],
            to_record=(),
            new=stored[len(stored) - 1 - k : -1],
            truncate_to=kept + k,
            expected_count=state.message_count,
        )

    k = len(new)
    if k and len(stored) >= k and _same(stored[-k:], new) and stored[-1].role != "assistant":
        before = stored[: len(stored) - k]
        if not history or not before or _tails_agree(history, before):
            # A retry of a turn stored without an answer (an import that ended on it, or
            # an answer that failed): the stored messages are this turn's, not new ones.
            return Reconciled(
                prompt=prompt,
                prior=before,
                to_record=(),
                new=stored[len(stored) - k :],
                expected_count=state.message_count,
            )

    imported: tuple[Message, ...] = ()
    if history and state.message_count == 0:
        imported = tuple(history)
    elif history and stored:
        position = _missing_from_store(history, stored)
        if position is not None:
            imported = tuple(history[position:])
    settled = edits_before is not None and bool(stored) and stored[-1].ts < edits_before
    edit = _edit_of(history, new, state) if settled and not imported else None
    if edit is not None:
        kept, at = edit
        branched = tuple(history[kept:])
        return Reconciled(
            prompt=prompt,
            prior=stored[:at] + branched,
            to_record=branched + new,
            new=new,
            branch_from=stored[at].index - 1,
            expected_count=state.message_count,
        )
    return Reconciled(
        prompt=prompt,
        prior=stored + imported,
        to_record=imported + new,
        new=new,
        expected_count=state.message_count if imported else None,
    )
