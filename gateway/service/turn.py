"""One request's memory work as data: what to forward, and what to record afterwards."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway import codec
from gateway.auth.identity import Identity, MemoryMode
from gateway.errors import QuotaExceeded
from gateway.memory import images as media
from gateway.memory.assemble import Context
from gateway.memory.model import Message, SessionState
from gateway.memory.prompt_cache import fingerprint, message_print
from gateway.memory.reconcile import Reconciled
from gateway.service.usage import UNKNOWN, Usage
from gateway.store.catalog import StoredReceipt
from gateway.store.keys import SessionKeys
from gateway.store.quota import Held

# How long a turn holds its new messages' bytes against its tenant's quota without its
# record (``store.quota``): past the upstream's wait for a first byte (120 s by default)
# with room for the answer. A turn not recorded (an upstream error, a client gone) gives
# them back then; one that records later is charged in full by its record.
HOLD_S = 300.0


@dataclass(frozen=True, slots=True)
class Turn:
    """One request's memory work: what to forward, and what to record after the answer."""

    keys: SessionKeys
    identity: Identity
    state: SessionState
    plan: Reconciled
    context: Context
    model: str
    messages: tuple[Message, ...]  # as the client sent them: planned again if the tail moved
    # Tokens of the messages the client sent (memory.accounting.tokens_sent): counted
    # once, for the metrics, the access line and the stored receipt.
    client_tokens: int = 0
    # ``messages`` with their images as references (what is planned and recorded), and
    # the images' bytes by hash (recorded once each with the turn).
    ingested: tuple[Message, ...] = ()
    media: Mapping[str, media.Blob] = field(default_factory=dict)
    # The answer's length the request asked room for: a retry's smaller budget keeps it.
    requested_output: int | None = None
    # The forwarded context's fingerprint (``forwarded_print``), kept with the record: the
    # next turn's receipt says how much of its context the upstream can reuse.
    forwarded: str = ""
    # The bytes reserved against the tenant's quota at admission (None: none reserved):
    # the record charges what it stores beyond them.
    held: Held | None = None

    @property
    def records(self) -> bool:
        """Whether the answer is to be recorded (memory on, not read-only)."""
        return self.identity.mode is MemoryMode.ON


@dataclass(frozen=True, slots=True)
class Answered:
    """A turn once its answer is over (or cut short): the tokens it took, as the rate
    limits charge them."""

    context_tokens: int  # the context forwarded, by the gateway's count
    # The upstream's counts (its ``usage``), when it gave them: the prompt, those of it
    # its prompt cache served, and the answer.
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    answer: Message | None  # None: the upstream answered nothing (an error, a refusal)
    # The tokens of an answer's chat payload in the turn's model, to count after the
    # response (``TokenCounter.count_payload``).
    count: Callable[[dict[str, Any]], int]


def another_users(owner: str | None, user_id: str | None) -> bool:
    """Whether a session of ``owner`` (None: no user yet) is another user's than the one a
    request names (None: none named). A session's user is set once (record.lua)."""
    return owner is not None and user_id is not None and owner != user_id


def forwarded_print(context: Context) -> str:
    """The context's fingerprint (``prompt_cache.fingerprint``): each message as it is
    forwarded (images by their reference: the bytes they stand for are the same)."""
    return fingerprint(
        [message_print(codec.dumps(m.to_openai()), m.tokens) for m in context.messages]
    )


def stored_receipt(
    turn: Turn, now: float, kept: int, request_id: str | None, usage: Usage = UNKNOWN
) -> StoredReceipt | None:
    """What the inspector shows of a recorded turn: what was forwarded, per tier, under
    which request id (the id of the request's log line and response header), and what
    the upstream said it took (``usage``: the turn is recorded once the upstream has
    answered, so its counts go in the record's own round trip)."""
    if not kept:
        return None
    data = {
        "request_id": request_id,
        "at": now,
        "model": turn.model,
        "client_tokens": turn.client_tokens,
        "receipt": turn.context.receipt.to_json(),
        "usage": usage.to_json(),
    }
    return StoredReceipt(codec.dumps(data), kept)


def over_quota(quota: int) -> QuotaExceeded:
    """The refusal (429) of a write its tenant's quota has no room for."""
    size = f"{quota // 2**20} MB" if quota >= 2**20 else f"{quota} bytes"
    return QuotaExceeded(
        f"this tenant's memory is at its quota ({size}): erase sessions to free some, "
        "or ask the operator for more"
    )


def incoming(messages: Sequence[Message]) -> Sequence[Message]:
    """What a turn is expected to store of a request's messages, reserved at its admission:
    those after the last assistant message (the new user message, tool results). A
    client that sends its whole history sends the rest again each turn; what the session
    did not hold of it is charged by the record."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "assistant":
            return messages[i + 1 :]
    return messages


def session_keys(identity: Identity) -> SessionKeys:
    return SessionKeys(identity.tenant, identity.session_id)
