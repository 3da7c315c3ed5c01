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
    * it does not match at all (the client edited or branched) → the store wins and only
      the new messages are recorded.

    A turn stored without an answer (an import that ended on a user message) and sent
    again is a retry: its stored messages are this turn's, and only the answer is added.

    A regenerate resends the last stored user turn without the answer we stored for it.
    It is recognised only when the request's history lines up with what was stored before
    that turn — for a client that sends single messages a repeated "continue" is a new
    turn, not a regenerate. The stored answer is then replaced, not duplicated.

    Concurrency: a plain new turn may land after any other turn (turns are appended whole).
    A plan that relies on the stored tail as it was loaded — an import, a retry, a
    regenerate — carries ``expected_count``: it is recorded only if the log still has that
    length, and otherwise reconciled again against the newer tail, so two requests that
    both saw the same missing history import it once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.memory.model import PROMPT_ROLES, Message, SessionState

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
    # The stored message count this plan relies on; None when it may land after any turn.
    expected_count: int | None = None


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


def reconcile(messages: Sequence[Message], state: SessionState) -> Reconciled:
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
    return Reconciled(
        prompt=prompt,
        prior=stored + imported,
        to_record=imported + new,
        new=new,
        expected_count=state.message_count if imported else None,
    )
