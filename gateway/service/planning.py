"""Reconciling a request with the stored session, and counting what it brings."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from gateway import offload
from gateway.memory.block import recalled_text
from gateway.memory.model import Message, SessionState
from gateway.memory.reconcile import Reconciled, reconcile
from gateway.text.tokens import LINE_MODEL, TokenCounter, uncounted_chars

# An edit abandons only a log whose newest message is at least this old: a person reads
# an answer before editing what led to it; requests sent together are not edits.
EDIT_AFTER_S = 1.0
# A message recorded with its recalled line's tokens (``Message.line_tokens``) up to this
# length: a chat message's; a longer one is counted when first recalled, if ever.
LINE_COUNT_CHARS = 4096


class Planner:
    """``reconcile`` with token counts: a message counted once, stored counts trusted."""

    def __init__(self, counter: TokenCounter, clock: Callable[[], float] = time.time) -> None:
        self.counter = counter
        self.clock = clock

    def counted(
        self, messages: tuple[Message, ...], model: str, memo: dict[int, Message]
    ) -> tuple[Message, ...]:
        """The messages with their token counts; a message met twice is counted once."""
        out = []
        for message in messages:
            if not message.tokens:
                if id(message) not in memo:
                    tokens = self.counter.count_message(message, model)
                    memo[id(message)] = message.but(tokens=tokens)
                message = memo[id(message)]
            out.append(message)
        return tuple(out)

    def lined(self, messages: tuple[Message, ...]) -> tuple[Message, ...]:
        """The messages with their recalled lines' tokens (``Message.line_tokens``)."""
        count = self.counter.for_model(LINE_MODEL)
        return tuple(
            m.but(line_tokens=count(recalled_text(m) + "\n")) if _unlined(m) else m
            for m in messages
        )

    async def lined_off_loop(self, messages: tuple[Message, ...]) -> tuple[Message, ...]:
        """``lined``, in the heavy-work pool when there is much to count (an import)."""
        size = sum(len(m.text) for m in messages if _unlined(m))
        return await offload.sized(size, self.lined, messages)

    async def counted_off_loop(
        self, messages: tuple[Message, ...], model: str
    ) -> tuple[Message, ...]:
        """``counted``, in the heavy-work pool when there is much to count (a long message:
        tokenizing a megabyte takes from a tenth of a second to seconds)."""
        return await offload.sized(uncounted_chars(messages), self.counted, messages, model, {})

    def plan_again(
        self, messages: tuple[Message, ...], state: SessionState, model: str
    ) -> Reconciled:
        # Planned again because another turn landed meanwhile: never an edit of it.
        return self._count_plan(reconcile(messages, state, edits_before=None), model)

    async def plan(
        self, messages: tuple[Message, ...], state: SessionState, model: str
    ) -> Reconciled:
        """The request reconciled with ``state``, counting in the heavy-work pool when
        this turn brings much text."""
        # A human edit comes well after the answer it replaces; requests sent together
        # with the same history are not edits of one another (see ``reconcile``).
        plan = reconcile(messages, state, edits_before=self.clock() - EDIT_AFTER_S)
        brought = (*plan.prompt, *plan.prior, *plan.to_record, *plan.new)
        return await offload.sized(uncounted_chars(brought), self._count_plan, plan, model)

    def _count_plan(self, plan: Reconciled, model: str) -> Reconciled:
        # Count only what this turn brings (prompt, new, imported): stored messages carry
        # their count, so a client resending a long history does not re-tokenize it.
        memo: dict[int, Message] = {}
        return replace(
            plan,
            prompt=self.counted(plan.prompt, model, memo),
            prior=self.counted(plan.prior, model, memo),
            to_record=self.counted(plan.to_record, model, memo),
            new=self.counted(plan.new, model, memo),
        )


def _unlined(message: Message) -> bool:
    return not message.line_tokens and len(message.text) <= LINE_COUNT_CHARS
