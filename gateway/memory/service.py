"""Runs the memory policy for one request: load, reconcile, assemble; later, record.

The IO edge of the memory package: the store is called here and nowhere else in
``memory/``; everything between the load and the record is pure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway.config import MemoryConfig
from gateway.identity import Identity
from gateway.memory.assemble import Context, WindowLimits, assemble
from gateway.memory.model import Message
from gateway.memory.reconcile import Reconciled, reconcile
from gateway.store.keys import SessionKeys
from gateway.store.redis_store import RedisStore
from gateway.tokens import TokenCounter


@dataclass(frozen=True, slots=True)
class Turn:
    """One request's memory work: what to forward, and what to record after the answer."""

    keys: SessionKeys
    identity: Identity
    plan: Reconciled
    context: Context
    model: str


class MemoryService:
    def __init__(self, store: RedisStore, counter: TokenCounter, config: MemoryConfig) -> None:
        self.store = store
        self.counter = counter
        self.config = config
        self.limits = WindowLimits(
            max_messages=config.effective_window_messages,
            max_tokens=config.effective_window_tokens,
            budget_tokens=config.budget_tokens,
        )

    def _counted(
        self, messages: tuple[Message, ...], model: str, memo: dict[int, Message]
    ) -> tuple[Message, ...]:
        """The messages with their token counts; a message met twice is counted once."""
        out = []
        for message in messages:
            if not message.tokens:
                if id(message) not in memo:
                    tokens = self.counter.count_message(message, model)
                    memo[id(message)] = replace(message, tokens=tokens)
                message = memo[id(message)]
            out.append(message)
        return tuple(out)

    async def prepare(self, identity: Identity, messages: tuple[Message, ...], model: str) -> Turn:
        """Load the session and plan the context (raises ``StoreUnavailable``)."""
        keys = SessionKeys(identity.tenant, identity.session_id)
        state = await self.store.load(keys, self.config.reconcile_tail)
        plan = reconcile(messages, state)
        # Count only what this turn brings (prompt, new, imported): stored messages carry
        # their count, so a client resending a long history does not re-tokenize it.
        memo: dict[int, Message] = {}
        plan = replace(
            plan,
            prompt=self._counted(plan.prompt, model, memo),
            prior=self._counted(plan.prior, model, memo),
            to_record=self._counted(plan.to_record, model, memo),
            new=self._counted(plan.new, model, memo),
        )
        context = assemble(plan, self.limits)
        return Turn(keys=keys, identity=identity, plan=plan, context=context, model=model)

    async def record(self, turn: Turn, answer: Message, *, now: float) -> tuple[int, int]:
        """Append this turn's new messages and the answer atomically, in one round trip."""
        stamped = tuple(
            replace(m, ts=now)
            for m in turn.plan.to_record + self._counted((answer,), turn.model, {})
        )
        return await self.store.record(
            turn.keys,
            stamped,
            now=now,
            user_id=turn.identity.user_id,
            truncate_to=turn.plan.truncate_to,
            expected_count=turn.plan.expected_count,
        )
