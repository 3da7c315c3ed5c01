"""One request's memory work as data: what to forward, and what to record afterwards."""

from __future__ import annotations

from collections.abc import Callable, Mapping
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


def check_quota(used: int, quota: int) -> None:
    """Refuse to store more for a tenant at its quota (429)."""
    if used >= quota:
        raise QuotaExceeded(
            f"this tenant's memory is at its quota ({quota // 2**20} MB stored): "
            "erase sessions to free some, or ask the operator for more"
        )


def session_keys(identity: Identity) -> SessionKeys:
    return SessionKeys(identity.tenant, identity.session_id)
