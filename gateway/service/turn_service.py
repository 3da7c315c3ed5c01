"""One proxied turn from the service's side: open it, forward it (again, smaller, after a
refusal of a context too long), record it, and account for its answer.

The route does HTTP only: it parses, calls ``open``, relays what ``forward`` returns,
calls ``record`` before acknowledging the answer, and ``completed`` once it is over. Every
memory decision is here: the budget and its ceilings, fail-open or closed when the store
is unavailable (an ``AsSent`` outcome, not an exception), and a record that completes
even when the request is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from gateway.auth.authenticator import Authenticator, Caller
from gateway.auth.identity import Identity, MemoryMode
from gateway.config import Settings
from gateway.errors import MemoryUnavailable
from gateway.memory.model import Message
from gateway.memory.model_budget import Ceilings, context_overflow, retry_budget
from gateway.observability import metrics, request_log
from gateway.service.activity import Activity
from gateway.service.answer_tokens import note_tokens_out
from gateway.service.replies import Reply, read_whole
from gateway.service.turn import Answered, Turn
from gateway.service.usage import UNKNOWN, Usage, read_usage
from gateway.store.redis_store import Held, StoreUnavailable
from gateway.text.tokens import TokenCounter

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Reply)

# Refuses a turn whose new messages do not continue the stored log (the chat dialect's
# ``check_turn_tool_results``: messages as sent, the plan's new ones, those before them).
ToolResultsCheck = Callable[[Sequence[Message], Sequence[Message], Sequence[Message]], None]


class TurnRecorder(Protocol):
    """Records a turn (``recording.Recorder``); raises ``StoreUnavailable``."""

    async def record(
        self,
        turn: Turn,
        answer: Message,
        *,
        now: float,
        retry_s: float = 0.0,
        request_id: str | None = None,
        usage: Usage = UNKNOWN,
    ) -> None: ...


class TurnMemory(Protocol):
    """What the turn service needs of ``MemoryService``."""

    clock: Callable[[], float]
    counter: TokenCounter

    @property
    def recorder(self) -> TurnRecorder: ...

    def budget_for(self, model: str, requested_output: int | None = None) -> int: ...

    async def prepare(
        self,
        identity: Identity,
        messages: tuple[Message, ...],
        model: str,
        *,
        requested_output: int | None = None,
        budget_tokens: int | None = None,
        held: Held | None = None,
    ) -> Turn: ...

    def give_back(self, tenant: str, held: Held) -> None: ...


@dataclass(frozen=True, slots=True)
class AsSent:
    """No memory for this request: it goes upstream as the client sent it, and
    ``status`` (its ``X-Memory-Status``) says why."""

    status: str


# Fail-open: the store was unavailable and ``redis.on_failure`` is "open".
DEGRADED = AsSent("degraded")
# Nothing new to answer (the request ends with an assistant message, as in a prefill):
# forwarded as sent rather than guessed at.
NOTHING_NEW = AsSent("off")


@dataclass(frozen=True, slots=True)
class Forwarded(Generic[R]):
    """What the upstream answered, to which turn's context (a retry's, after a refusal of
    a context too long), and the memory headers of that context. ``refusal``: an error
    answer already read (and closed), to relay as it came."""

    reply: R
    turn: Turn
    headers: dict[str, str]
    refusal: bytes | None = None


class TurnService:
    """The memory side of the proxy's turns, one per API (its own ceilings and
    recordings)."""

    def __init__(
        self,
        memory: TurnMemory,
        auth: Authenticator,
        settings: Settings,
        check_tool_results: ToolResultsCheck,
        activity: Activity | None = None,
    ) -> None:
        self.memory = memory
        # Where the in-process worker learns that a turn is being worked on.
        self.activity = activity or Activity()
        self.auth = auth
        self.settings = settings
        self.check_tool_results = check_tool_results
        self.clock = memory.clock
        # Budgets that fitted models after their refusals (``forward``).
        self.ceilings = Ceilings()
        # Recordings run to completion even if their request is cancelled; held here so
        # that none is garbage-collected half-way.
        self._recordings: set[asyncio.Task[bool]] = set()

    async def open(
        self,
        caller: Caller,
        session_id: str,
        user_id: str | None,
        mode: MemoryMode,
        messages: tuple[Message, ...],
        model: str,
        requested_output: int | None,
    ) -> Turn | AsSent:
        """The turn to forward: the session loaded and the context planned within the
        model's budget (less when it refused a larger context lately). ``AsSent`` when
        memory has nothing to do, or fails open; ``MemoryUnavailable`` when it fails
        closed."""
        try:
            caller = await self.auth.resolve(caller)
            request_log.note(tenant=caller.tenant)  # a keyed hash of the key, never the key
            if user_id is not None:
                shown = request_log.user_field(
                    user_id, self.settings.server.log_user_ids, self.auth.tenants.keyed
                )
                request_log.note(user_id=shown)
            identity = Identity(
                caller.tenant, session_id, user_id, mode, caller.quota_bytes, caller.users
            )
            budget = self.memory.budget_for(model, requested_output)
            budget = self.ceilings.bound(model, budget, self.clock())
            with self.activity.working():
                turn = await self.memory.prepare(
                    identity,
                    messages,
                    model,
                    requested_output=requested_output,
                    budget_tokens=budget,
                )
        except StoreUnavailable as error:
            if self.settings.redis.on_failure == "closed":
                raise MemoryUnavailable(
                    "memory store unavailable; the gateway is configured to fail closed"
                ) from None
            log.warning("memory degraded for this request: %s", error)
            metrics.degraded("redis_unavailable")
            return DEGRADED
        try:
            self.check_tool_results(messages, turn.plan.new, turn.plan.prior)
        except BaseException:
            self._unrecorded(turn)
            raise
        if not turn.plan.new:
            self._unrecorded(turn)
            return NOTHING_NEW
        return turn

    def _unrecorded(self, turn: Turn) -> None:
        """A turn that will not be recorded gives its hold on the quota back."""
        if turn.held is not None:
            self.memory.give_back(turn.keys.tenant, turn.held)

    async def forward(self, turn: Turn, send: Callable[[Turn], Awaitable[R]]) -> Forwarded[R]:
        """The upstream's answer to ``turn``'s context (``send`` sends one); when it
        refuses that context as longer than the model's window, to one planned again
        within a budget that fits (``model_budget.retry_budget``): once, never for any
        other answer. Without this, a session that outgrew a small model (the default
        3,000-token budget against llama.cpp's 2,048) would be refused on every turn."""
        reply = await send(turn)
        if reply.status_code != 400:  # the one status an overflow comes with
            return _forwarded(reply, turn)
        refusal = await read_whole(reply)
        overflow = context_overflow(reply.status_code, refusal)
        if overflow is None:
            return _forwarded(reply, turn, refusal)
        sent_tokens = turn.context.receipt.total_tokens
        budget = retry_budget(sent_tokens, overflow, turn.requested_output)
        try:
            smaller = await self.memory.prepare(
                turn.identity,
                turn.messages,
                turn.model,
                requested_output=turn.requested_output,
                budget_tokens=budget,
                held=turn.held,  # reserved once, at the turn's admission
            )
        except StoreUnavailable:
            return _forwarded(reply, turn, refusal)  # the refusal stands, as the upstream said
        if smaller.context.receipt.total_tokens >= sent_tokens:
            # Only the prompt, the new turn and the window's last messages were left: a
            # smaller budget would send the same again.
            return _forwarded(reply, turn, refusal)
        log.info(
            "upstream refused a %d-token context as too long; retrying within %d tokens",
            sent_tokens,
            budget,
        )
        metrics.context_retry()
        request_log.note(context_retry=sent_tokens)
        reply = await send(smaller)
        if reply.status_code == 200:
            self.ceilings.fitted(turn.model, budget, self.clock())
        return _forwarded(reply, smaller)

    async def record(self, turn: Turn, answer: Message, usage: Any = None) -> bool:
        """Record the turn whole, even if the request is cancelled meanwhile (a client
        that left): False when it should have been and was not (the store unavailable),
        so its answer goes unacknowledged. A read-only turn records nothing. ``usage``:
        the answer's usage in chat terms, as far as the upstream gave it (its stored
        receipt shows it)."""
        if not turn.records:
            return True
        answer = _kept(answer, self.settings.server.max_message_bytes)
        task = asyncio.ensure_future(self._record_now(turn, answer, read_usage(usage)))
        self._recordings.add(task)
        task.add_done_callback(self._recordings.discard)
        # A cancellation ends the wait, never the recording (the task runs on).
        return await asyncio.shield(task)

    async def settle(self) -> None:
        """Wait for the recordings still running: a server stopping must not cut a turn
        the store is writing (its client may have left; each write is bounded by the
        store's deadline and ``redis.record_retry_s``)."""
        while self._recordings:
            await asyncio.gather(*self._recordings, return_exceptions=True)

    async def _record_now(self, turn: Turn, answer: Message, usage: Usage) -> bool:
        try:
            with self.activity.working():
                await self.memory.recorder.record(
                    turn,
                    answer,
                    now=self.clock(),
                    retry_s=self.settings.redis.record_retry_s,
                    request_id=request_log.current_request_id(),
                    usage=usage,
                )
        except StoreUnavailable as error:
            # The answer is not acknowledged: a stream ends with an error event instead of
            # [DONE], a whole answer says "degraded". A client that resends its history
            # brings the turn back (see reconcile).
            log.warning("turn not recorded: %s", error)
            metrics.degraded("record_failed")
            # A stream's header said "ok" before this: its access line says what happened.
            request_log.note(memory_status="degraded")
            return False
        return True

    def completed(self, turn: Turn, answer: Message | None, usage: Any) -> Answered:
        """The turn's answer is over (whatever was relayed of it): its tokens on the
        access line (the upstream's count when it gave one), the turn's content with
        content logging on (``gateway.content`` at DEBUG), the upstream's prompt and
        cached tokens in the metrics, and what the rate limits charge for it."""
        read = read_usage(usage)
        prompt, completion = read.prompt_tokens, read.completion_tokens
        metrics.upstream_usage(prompt, read.cached_tokens)
        counter = self.memory.counter
        if request_log.collecting():
            if completion is not None:
                request_log.note(tokens_out=completion)
            elif answer is not None:
                # Counted once the client has the whole response, a long answer (one a
                # client left unread, up to upstream.max_response_bytes) off the loop
                # and only in part: see answer_tokens.
                note_tokens_out(counter, answer, turn.model)
        if answer is not None and request_log.content_enabled():
            request_log.log_content(
                turn.identity.session_id, turn.context.openai_messages(), answer.to_openai()
            )
        count = partial(counter.count_payload, model=turn.model)
        context = turn.context.receipt.total_tokens
        return Answered(context, prompt, read.cached_tokens, completion, answer, count)


def _forwarded(reply: R, turn: Turn, refusal: bytes | None = None) -> Forwarded[R]:
    return Forwarded(reply, turn, memory_headers(turn), refusal)


def memory_headers(turn: Turn) -> dict[str, str]:
    """The memory headers of an answer to ``turn`` (noted, with its tokens, for the
    metrics and the access line: once, for the context that went)."""
    receipt = turn.context.receipt
    metrics.tokens(turn.client_tokens, receipt.total_tokens, receipt.stable)
    request_log.note(
        tokens_in=turn.client_tokens,
        tokens_context=receipt.total_tokens,
        tiers=receipt.tiers,
        recalled=len(receipt.recalled),
    )
    if receipt.stable is not None:
        request_log.note(tokens_stable=receipt.stable)
    return {
        "x-memory-status": "ok",
        "x-memory-context-tokens": str(receipt.total_tokens),
        "x-memory-receipt": receipt.header(),
    }


def _kept(answer: Message, limit: int) -> Message:
    """The answer as memory keeps it: its text cut at the size a client's message may
    have. An answer may be up to ``upstream.max_response_bytes``; stored whole, one
    would make the record script copy tens of MB while Redis serves no one else, to keep
    text no context budget could ever send again."""
    text = answer.content
    if not isinstance(text, str) or len(text) <= limit // 4:  # (at most 4 bytes a char)
        return answer
    head = text[:limit]  # (``limit`` bytes take at most as many characters)
    raw = head.encode("utf-8", "surrogatepass")
    if len(raw) <= limit and len(head) == len(text):
        return answer
    cut = raw[: limit - 128].decode("utf-8", "ignore")  # room for the note
    note = f"\n[… this answer was cut at {len(cut):,} of its {len(text):,} characters]"
    return answer.with_content(cut + note, tokens=0)  # (calls, output items kept; recounted)
