"""Runs the memory policy for one request: load, reconcile, assemble; later, record.

The IO edge of the memory package: the store is called here and in the worker, nowhere
else in ``memory/``; everything between the load and the record is pure.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gateway.config import Composition, EmbeddingsConfig, MemoryConfig
from gateway.identity import Identity
from gateway.memory import recall
from gateway.memory.assemble import Context, Recalled, assemble, window_units
from gateway.memory.jobs import Job, schedule
from gateway.memory.model import Message, Pin, SessionState
from gateway.memory.reconcile import Reconciled, reconcile
from gateway.memory.tiers.pins import AUTO_PIN_IMPORTANCE, requested_pin
from gateway.store.keys import SessionKeys, UserKeys
from gateway.store.redis_store import RedisStore, TailMoved
from gateway.tokens import TokenCounter

log = logging.getLogger(__name__)

# A Lua script unpacks its arguments onto the stack; imports go in batches below that limit.
IMPORT_BATCH = 500
END_JOB = Job("end", 0, 0, 0)
# Records that lost a race for the tail and were planned again; each race needs another
# turn to land in between, so a few attempts are plenty.
RECORD_ATTEMPTS = 5


def _query(messages: Sequence[Message]) -> str:
    """What recall searches for: the newest user message of the request."""
    return next((m.text for m in reversed(messages) if m.role == "user"), "")


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


def session_keys(identity: Identity) -> SessionKeys:
    return SessionKeys(identity.tenant, identity.session_id)


class MemoryService:
    def __init__(
        self,
        store: RedisStore,
        counter: TokenCounter,
        config: MemoryConfig,
        embedder: recall.Embedder | None = None,
    ) -> None:
        self.store = store
        self.counter = counter
        self.config = config
        self.composition: Composition = config.composition
        self.embedder = embedder

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
        keys = session_keys(identity)
        composition = self.composition
        query = _query(messages) if composition.recall is not None else ""
        user = self._user_keys(identity)
        state = await self.store.load(
            keys, self.config.reconcile_tail, query_terms=recall.terms(query), user=user
        )
        plan = self._plan(messages, state, model)
        young = (
            composition.cross_session is not None
            and state.message_count < composition.cross_session.young_session_messages
        )
        recalled = await self._recall(keys, state, plan, query, user if young else None, model)
        context = assemble(
            plan,
            tiers=state.tiers,
            pins=state.pins,
            composition=composition,
            budget_tokens=self.config.budget_tokens,
            memory_role=self.config.memory_role,
            count=lambda text: self.counter.count_text(text, model),
            recalled=recalled,
            profile=state.profile if young else None,
        )
        return Turn(keys, identity, state, plan, context, model, messages)

    def _plan(self, messages: tuple[Message, ...], state: SessionState, model: str) -> Reconciled:
        plan = reconcile(messages, state)
        # Count only what this turn brings (prompt, new, imported): stored messages carry
        # their count, so a client resending a long history does not re-tokenize it.
        memo: dict[int, Message] = {}
        return replace(
            plan,
            prompt=self._counted(plan.prompt, model, memo),
            prior=self._counted(plan.prior, model, memo),
            to_record=self._counted(plan.to_record, model, memo),
            new=self._counted(plan.new, model, memo),
        )

    def _user_keys(self, identity: Identity) -> UserKeys | None:
        composition = self.composition
        wants_user = composition.cross_session is not None or (
            composition.recall is not None and composition.recall.across_sessions
        )
        if identity.user_id is None or not wants_user:
            return None
        return UserKeys(identity.tenant, identity.user_id)

    async def _recall(
        self,
        keys: SessionKeys,
        state: SessionState,
        plan: Reconciled,
        query: str,
        user: UserKeys | None,
        model: str,
    ) -> list[Recalled]:
        """Archived messages matching the new user message, best first, outside the window.

        The postings came with the load; the hits cost one more round trip, and only when
        there are any. A young session of a known user also searches their last sessions.
        """
        tier = self.composition.recall
        if tier is None or not query:
            return []
        shown = {
            m.index for unit in window_units(plan, state.tiers, self.composition) for m in unit
        }
        shown |= {m.index for m in plan.new if m.index}
        embeddings = tier.embeddings if self.embedder is not None else None
        hits = recall.rank(
            query,
            state.postings,
            documents=state.indexed_docs,
            total_length=state.indexed_length,
            exclude=frozenset(shown),
            limit=embeddings.candidates if embeddings else tier.hits,
        )
        hits = [hit for hit in hits if hit.score >= tier.min_score]
        if embeddings is not None and len(hits) > 1:
            hits = await self._rerank(keys, query, hits, embeddings, tier.hits)
        # This session's matches first; the user's earlier sessions fill what is left.
        best = [(keys, hit.index) for hit in hits[: tier.hits]]
        if user is not None and tier.across_sessions and state.history and len(best) < tier.hits:
            others = await self._recall_elsewhere(keys, state, query, tier.hits)
            strong = sorted((o for o in others if o[0] >= tier.min_score), key=lambda o: -o[0])
            best += [(session, index) for _, session, index in strong][: tier.hits - len(best)]
        out: list[Recalled] = []
        for session in dict.fromkeys(session for session, _ in best):
            indexes = [index for k, index in best if k == session]
            for message in await self.store.messages_at(session, indexes):
                label = None if session == keys else session.session_id
                out.append(Recalled(self._counted((message,), model, {})[0], label))
        order = {(k.session_id, index): n for n, (k, index) in enumerate(best)}
        return sorted(out, key=lambda r: order[(r.session or keys.session_id, r.message.index)])

    async def _rerank(
        self,
        keys: SessionKeys,
        query: str,
        hits: list[recall.Hit],
        config: EmbeddingsConfig,
        limit: int,
    ) -> list[recall.Hit]:
        """Lexical candidates reordered by meaning; on any failure, the lexical order."""
        assert self.embedder is not None
        try:
            async with asyncio.timeout(config.timeout_s):
                (vector,) = await self.embedder.embed([query])
        except (recall.EmbeddingsUnavailable, TimeoutError) as error:
            log.warning("recall stays lexical: %s", error)
            return hits
        stored = await self.store.vectors(keys, [hit.index for hit in hits])
        vectors = {index: recall.unpack(raw) for index, raw in stored.items()}
        return recall.rerank(hits, vector, vectors, weight=config.weight, limit=limit)

    async def _recall_elsewhere(
        self, keys: SessionKeys, state: SessionState, query: str, limit: int
    ) -> list[tuple[float, SessionKeys, int]]:
        sessions = [
            SessionKeys(keys.tenant, entry["session_id"])
            for entry in state.history
            if entry.get("session_id") and entry["session_id"] != keys.session_id
        ]
        postings = await self.store.postings(sessions, recall.terms(query))
        found = []
        for session, (posting, documents, length) in zip(sessions, postings, strict=True):
            for hit in recall.rank(
                query, posting, documents=documents, total_length=length, limit=limit
            ):
                found.append((hit.score, session, hit.index))
        return found

    async def record(self, turn: Turn, answer: Message, *, now: float) -> None:
        """Append this turn's new messages and the answer atomically, then enqueue jobs.

        A plan that relied on the stored tail is made again when a concurrent turn landed
        first (``TailMoved``); after ``RECORD_ATTEMPTS`` such races the turn is not recorded
        (the caller reports it degraded) rather than recorded twice.
        """
        (answer,) = self._counted((answer,), turn.model, {})
        plan, tail = turn.plan, turn.state.tail
        for attempt in range(RECORD_ATTEMPTS):
            try:
                await self._append(
                    turn.keys,
                    turn.identity.user_id,
                    (*plan.to_record, answer),
                    tail=tail,
                    now=now,
                    truncate_to=plan.truncate_to,
                    expected_count=plan.expected_count,
                )
                return
            except TailMoved:
                if attempt == RECORD_ATTEMPTS - 1:
                    raise
            state = await self.store.load(turn.keys, self.config.reconcile_tail)
            plan, tail = self._plan(turn.messages, state, turn.model), state.tail

    async def import_messages(
        self, keys: SessionKeys, user_id: str | None, messages: tuple[Message, ...], *, now: float
    ) -> int:
        """Append messages as if they had been exchanged (the same policy runs); the count."""
        state = await self.store.load(keys, self.config.reconcile_tail)
        tail = state.tail
        count = state.message_count
        model = self.counter.default_model
        for start in range(0, len(messages), IMPORT_BATCH):
            batch = self._counted(messages[start : start + IMPORT_BATCH], model, {})
            tail, count = await self._append(keys, user_id, batch, tail=tail, now=now)
        return count

    async def _append(
        self,
        keys: SessionKeys,
        user_id: str | None,
        messages: tuple[Message, ...],
        *,
        tail: tuple[Message, ...],
        now: float,
        truncate_to: int | None = None,
        expected_count: int | None = None,
    ) -> tuple[tuple[Message, ...], int]:
        stamped = tuple(replace(m, ts=now) for m in messages)
        recorded = await self.store.record(
            keys,
            stamped,
            now=now,
            user_id=user_id,
            truncate_to=truncate_to,
            expected_count=expected_count,
            # Only a composition that recalls pays for the index (Redis memory, CPU).
            index=self.composition.recall is not None,
        )
        appended = tuple(replace(m, index=recorded.first + i) for i, m in enumerate(stamped))
        history = tuple(m for m in tail if m.index < recorded.first) + appended
        jobs = schedule(
            self.composition,
            history,
            count_before=recorded.first - 1,
            turns_before=recorded.turns - sum(1 for m in appended if m.role == "user"),
        )
        if jobs:
            await self.store.enqueue(keys, jobs)
        if self.composition.pins is not None and self.composition.pins.auto_pin:
            for message in appended:
                content = requested_pin(message)
                if content is not None:
                    await self.store.add_pin(keys, auto_pin(content, message.index, now))
        if recorded.new_user and user_id:
            user = UserKeys(keys.tenant, user_id)
            await self.store.index_user_session(user, keys.session_id)
            await self._end_idle_sessions(user, keys, now)
        return history[-self.config.reconcile_tail :], recorded.count

    async def _end_idle_sessions(self, user: UserKeys, keys: SessionKeys, now: float) -> None:
        """A user starting a session ends their idle ones (seed 001's end of session), so
        their final summaries reach the cross-session profile; the worker does the work."""
        cross = self.composition.cross_session
        if cross is None:
            return
        idle = await self.store.idle_sessions(
            user, idle_before=now - cross.idle_end_s, exclude=keys.session_id
        )
        for session_id in idle:
            await self.store.enqueue(SessionKeys(keys.tenant, session_id), [END_JOB])


def auto_pin(content: str, source_index: int, now: float) -> Pin:
    """A pin the user asked for in a message; its id is derived, so a retry re-pins nothing."""
    digest = hashlib.sha256(f"{source_index}:{content}".encode()).hexdigest()[:12]
    return Pin(f"pin_auto_{digest}", content, AUTO_PIN_IMPORTANCE, source_index, "auto", now)
