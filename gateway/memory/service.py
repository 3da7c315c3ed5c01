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

from gateway import codec
from gateway.config import Composition, EmbeddingsConfig, MemoryConfig
from gateway.identity import Identity
from gateway.memory import recall
from gateway.memory.assemble import Context, Recalled, assemble, window_units
from gateway.memory.jobs import Job, schedule
from gateway.memory.model import Message, Pin, SessionState
from gateway.memory.recent import Recent, RecentSet
from gateway.memory.reconcile import Reconciled, reconcile
from gateway.memory.tiers.pins import AUTO_PIN_IMPORTANCE, requested_pin
from gateway.metrics import tokens_sent
from gateway.request_log import current_request_id
from gateway.store.catalog import REFRESH_S, StoredReceipt
from gateway.store.keys import SessionKeys, UserKeys
from gateway.store.redis_store import (
    Archive,
    Joining,
    Loaded,
    Predicted,
    RedisStore,
    TailMoved,
)
from gateway.tokens import TokenCounter

log = logging.getLogger(__name__)

# A Lua script unpacks its arguments onto the stack; imports go in batches below that limit.
IMPORT_BATCH = 500
END_JOB = Job("end", 0, 0, 0)
# Records that lost a race for the tail and were planned again; each race needs another
# turn to land in between, so a few attempts are plenty.
RECORD_ATTEMPTS = 5
# A load brings this many messages per recall hit wanted (see redis_store.LOAD_SCRIPT).
# On bench/recall.py's conversations (150 probes, half of them paraphrased) a second read
# was needed for 2 probes at 320 messages and 17 at 2,000 (3 per hit: 3 and 19; the
# newest postings of the rarest term instead, at 320 messages: 24).
CANDIDATES_PER_HIT = 4
# Users and sessions remembered for prefetching (a few MB at most).
RECENT_ENTRIES = 10_000


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
    siblings: tuple[str, ...] | None = None  # the user's sessions, when the load read them
    # Tokens of the messages the client sent (metrics.tokens_sent): counted once, for the
    # metrics, the access line and the stored receipt.
    client_tokens: int = 0


def _stored_receipt(turn: Turn, now: float, kept: int) -> StoredReceipt | None:
    """What the inspector shows of a recorded turn: what was forwarded, per tier, under
    which request id (the id of the request's log line and response header)."""
    if not kept:
        return None
    data = {
        "request_id": current_request_id(),
        "at": now,
        "model": turn.model,
        "client_tokens": turn.client_tokens,
        "receipt": turn.context.receipt.to_json(),
    }
    return StoredReceipt(codec.dumps(data), kept)  # orjson: stdlib json was ~1% of a turn


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
        # Prefetch hints, never trusted as data: which sessions a user's history named at
        # their last request (their archives come with the next load), and which sessions
        # are past the young-session age (no cross-session recall, nothing to prefetch).
        self._peers: Recent[UserKeys, tuple[SessionKeys, ...]] = Recent(RECENT_ENTRIES)
        self._grown: RecentSet[SessionKeys] = RecentSet(RECENT_ENTRIES)
        # And the sessions known to be their user's already (no idle check to prepare).
        self._joined: RecentSet[tuple[SessionKeys, str | None]] = RecentSet(RECENT_ENTRIES)

    def _counted(
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

    async def prepare(self, identity: Identity, messages: tuple[Message, ...], model: str) -> Turn:
        """Load the session and plan the context (raises ``StoreUnavailable``).

        One round trip, usually: the load brings the recall candidates of this session,
        and of the user's earlier sessions this process saw named at their last request.
        """
        keys = session_keys(identity)
        composition = self.composition
        query = _query(messages) if composition.recall is not None else ""
        user = self._user_keys(identity)
        young_tier = composition.cross_session
        maybe_young = young_tier is not None and keys not in self._grown
        # A session not known to be its user's may be new to them: their other sessions
        # are read now, for the record to find the idle ones among them (see _joining).
        joined = (keys, identity.user_id)
        maybe_new = user is not None and young_tier is not None and joined not in self._joined
        loaded = await self.store.load_turn(
            keys,
            self.config.reconcile_tail,
            query_terms=recall.terms(query),
            user=user,
            candidates=self._candidates(),
            peers=self._peers.get(user, ()) if user is not None and query and maybe_young else (),
            user_sessions=maybe_new,
        )
        state = loaded.state
        if user is not None and state.user_id == identity.user_id:
            self._joined.add(joined)
        plan = self._plan(messages, state, model)
        young = young_tier is not None and state.message_count < young_tier.young_session_messages
        if young_tier is not None and not young:
            self._grown.add(keys)  # sessions only grow: no more prefetching for this one
        recalled = await self._recall(keys, loaded, plan, query, user if young else None, model)
        context = assemble(
            plan,
            tiers=state.tiers,
            pins=state.pins,
            composition=composition,
            budget_tokens=self.config.budget_tokens,
            memory_role=self.config.memory_role,
            count=self.counter.for_model(model),
            recalled=recalled,
            profile=state.profile if young else None,
        )
        siblings = loaded.user_sessions
        sent = tokens_sent(messages, plan)
        return Turn(keys, identity, state, plan, context, model, messages, siblings, sent)

    def _candidates(self) -> int:
        """Messages a load brings per session for recall to choose its hits from."""
        tier = self.composition.recall
        if tier is None:
            return 0
        wanted = tier.embeddings.candidates if tier.embeddings and self.embedder else tier.hits
        return CANDIDATES_PER_HIT * wanted

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
        loaded: Loaded,
        plan: Reconciled,
        query: str,
        user: UserKeys | None,
        model: str,
    ) -> list[Recalled]:
        """Archived messages matching the new user message, best first, outside the window.

        The postings and the likely hits came with the load; a hit that did not costs one
        more round trip. A young session of a known user also searches their last sessions.
        """
        tier = self.composition.recall
        if tier is None or not query:
            return []
        state = loaded.state
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
        archives = {keys: loaded.archive}
        if user is not None and tier.across_sessions and state.history and len(best) < tier.hits:
            others, elsewhere = await self._recall_elsewhere(keys, user, loaded, query, tier.hits)
            strong = sorted((o for o in others if o[0] >= tier.min_score), key=lambda o: -o[0])
            best += [(session, index) for _, session, index in strong][: tier.hits - len(best)]
            archives |= elsewhere
        tail = {m.index: m for m in state.tail}
        found: dict[tuple[SessionKeys, int], Message] = {}
        for session, index in best:
            message = tail.get(index) if session == keys else None
            message = message or (archives[session].message(index) if session in archives else None)
            if message is not None:
                found[(session, index)] = message
        for session in dict.fromkeys(session for session, _ in best):
            missing = [i for k, i in best if k == session and (k, i) not in found]
            if missing:  # a hit the load's candidates missed
                found |= {
                    (session, m.index): m for m in await self.store.messages_at(session, missing)
                }
        return [
            Recalled(
                self._counted((found[hit],), model, {})[0],
                None if hit[0] == keys else hit[0].session_id,
            )
            for hit in best
            if hit in found
        ]

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
        self, keys: SessionKeys, user: UserKeys, loaded: Loaded, query: str, limit: int
    ) -> tuple[list[tuple[float, SessionKeys, int]], dict[SessionKeys, Archive]]:
        """Matches in the user's ended sessions (their history, as loaded with this
        request), and those sessions' archives. Only sessions the history names are
        searched: a prefetched one it no longer names (erased) is ignored."""
        sessions = [
            SessionKeys(keys.tenant, entry["session_id"])
            for entry in loaded.state.history
            if entry.get("session_id") and entry["session_id"] != keys.session_id
        ]
        self._peers.put(user, tuple(sessions))
        archives = {s: loaded.peers[s] for s in sessions if s in loaded.peers}
        missing = [s for s in sessions if s not in archives]
        if missing:  # the user's history changed since this process last saw it
            terms = recall.terms(query)
            fetched = await self.store.archives(missing, terms, self._candidates())
            archives |= dict(zip(missing, fetched, strict=True))
        found = []
        for session, archive in archives.items():
            for hit in recall.rank(
                query,
                archive.postings,
                documents=archive.documents,
                total_length=archive.total_length,
                limit=limit,
            ):
                found.append((hit.score, session, hit.index))
        return found, archives

    async def record(self, turn: Turn, answer: Message, *, now: float) -> None:
        """Append this turn's new messages and the answer atomically, with their jobs.

        A plan that relied on the stored tail is made again when a concurrent turn landed
        first (``TailMoved``); after ``RECORD_ATTEMPTS`` such races the turn is not recorded
        (the caller reports it degraded) rather than recorded twice.
        """
        (answer,) = self._counted((answer,), turn.model, {})
        plan, state = turn.plan, turn.state
        receipt = _stored_receipt(turn, now, self.config.receipts)
        for attempt in range(RECORD_ATTEMPTS):
            try:
                await self._append(
                    turn.keys,
                    turn.identity.user_id,
                    (*plan.to_record, answer),
                    stored=state,
                    now=now,
                    truncate_to=plan.truncate_to,
                    expected_count=plan.expected_count,
                    siblings=turn.siblings if state is turn.state else None,
                    receipt=receipt,
                )
                return
            except TailMoved:
                if attempt == RECORD_ATTEMPTS - 1:
                    raise
            state = await self.store.load(turn.keys, self.config.reconcile_tail)
            plan = self._plan(turn.messages, state, turn.model)

    async def import_messages(
        self, keys: SessionKeys, user_id: str | None, messages: tuple[Message, ...], *, now: float
    ) -> int:
        """Append messages as if they had been exchanged (the same policy runs); the count."""
        state = await self.store.load(keys, self.config.reconcile_tail)
        model = self.counter.default_model
        for start in range(0, len(messages), IMPORT_BATCH):
            batch = self._counted(messages[start : start + IMPORT_BATCH], model, {})
            state = await self._append(keys, user_id, batch, stored=state, now=now)
        return state.message_count

    async def _append(
        self,
        keys: SessionKeys,
        user_id: str | None,
        messages: tuple[Message, ...],
        *,
        stored: SessionState,
        now: float,
        truncate_to: int | None = None,
        expected_count: int | None = None,
        siblings: tuple[str, ...] | None = None,
        receipt: StoredReceipt | None = None,
    ) -> SessionState:
        """Record ``messages`` after the ``stored`` state, with the jobs and pins they make
        due, in one round trip when the log is as ``stored`` says (see ``Predicted``).
        ``siblings``, the user's sessions when the load read them, lets a session new to
        its user find their idle sessions in that round trip too.

        Returns what is known of the session afterwards (its count, turns, user and tail).
        """
        stamped = tuple(m.but(ts=now) for m in messages)
        before = (
            stored.message_count if truncate_to is None else min(stored.message_count, truncate_to)
        )
        expected = self._writes(stored.tail, stamped, before, stored.turns, now)
        user = UserKeys(keys.tenant, user_id) if user_id else None
        recorded = await self.store.record(
            keys,
            stamped,
            now=now,
            user_id=user_id,
            truncate_to=truncate_to,
            expected_count=expected_count,
            # Only a composition that recalls pays for the index (Redis memory, CPU).
            index=self.composition.recall is not None,
            predicted=expected,
            joining=self._joining(keys, user, stored, siblings, now),
            receipt=receipt,
            listed=now - stored.updated >= REFRESH_S,
        )
        users = sum(1 for m in stamped if m.role == "user")
        if not recorded.predicted:  # another turn landed in between: the real indexes
            actual = self._writes(
                stored.tail, stamped, recorded.first - 1, recorded.turns - users, now
            )
            if actual.jobs:
                await self.store.enqueue(keys, actual.jobs)
            for pin in actual.pins:
                await self.store.add_pin(keys, pin)
        if recorded.new_user and user is not None:
            foreseen = user_id != stored.user_id
            if not foreseen:  # a concurrent turn changed the session's user meanwhile
                await self.store.index_user_session(user, keys.session_id)
            if foreseen and siblings is not None:
                await self._end_sessions(keys.tenant, recorded.idle)
            else:
                await self._end_idle_sessions(user, keys, now)
        appended = tuple(m.but(index=recorded.first + i) for i, m in enumerate(stamped))
        history = tuple(m for m in stored.tail if m.index < recorded.first) + appended
        return replace(
            stored,
            message_count=recorded.count,
            turns=recorded.turns,
            user_id=user_id or stored.user_id,
            tail=history[-self.config.reconcile_tail :],
        )

    def _writes(
        self,
        tail: tuple[Message, ...],
        messages: tuple[Message, ...],
        count_before: int,
        turns_before: int,
        now: float,
    ) -> Predicted:
        """The jobs and automatic pins that appending ``messages`` after ``count_before``
        stored messages makes due (pure: jobs and pin ids derive from the indexes)."""
        appended = tuple(m.but(index=count_before + 1 + i) for i, m in enumerate(messages))
        history = tuple(m for m in tail if m.index <= count_before) + appended
        jobs = schedule(
            self.composition, history, count_before=count_before, turns_before=turns_before
        )
        pins = []
        if self.composition.pins is not None and self.composition.pins.auto_pin:
            for message in appended:
                content = requested_pin(message)
                if content is not None:
                    pins.append(auto_pin(content, message.index, now))
        return Predicted(count_before + 1, turns_before, tuple(jobs), tuple(pins))

    def _joining(
        self,
        keys: SessionKeys,
        user: UserKeys | None,
        stored: SessionState,
        siblings: tuple[str, ...] | None,
        now: float,
    ) -> Joining | None:
        """A session new to its user joins their index in the record's round trip; with
        their sessions known from the load, those gone idle are found there too."""
        if user is None or user.user_id == stored.user_id:
            return None
        cross = self.composition.cross_session
        if cross is None or siblings is None:
            return Joining(user)
        others = tuple(s for s in siblings if s != keys.session_id)
        return Joining(user, others, now - cross.idle_end_s)

    async def _end_idle_sessions(self, user: UserKeys, keys: SessionKeys, now: float) -> None:
        """A user starting a session ends their idle ones (seed 001's end of session), so
        their final summaries reach the cross-session profile; the worker does the work."""
        cross = self.composition.cross_session
        if cross is None:
            return
        idle = await self.store.idle_sessions(
            user, idle_before=now - cross.idle_end_s, exclude=keys.session_id
        )
        await self._end_sessions(keys.tenant, idle)

    async def _end_sessions(self, tenant: str, session_ids: Sequence[str]) -> None:
        for session_id in session_ids:
            await self.store.enqueue(SessionKeys(tenant, session_id), [END_JOB])


def auto_pin(content: str, source_index: int, now: float) -> Pin:
    """A pin the user asked for in a message; its id is derived, so a retry re-pins nothing."""
    digest = hashlib.sha256(f"{source_index}:{content}".encode()).hexdigest()[:12]
    return Pin(f"pin_auto_{digest}", content, AUTO_PIN_IMPORTANCE, source_index, "auto", now)
