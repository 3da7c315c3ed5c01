"""Runs the memory policy for one request: load, reconcile, assemble; later, record.

The IO edge of the memory package: the store is called here and in the worker, nowhere
else in ``memory/``; everything between the load and the record is pure.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from gateway import codec, offload
from gateway.config import Composition, EmbeddingsConfig, MemoryConfig, RecallTier
from gateway.embedder import StaticEmbedder
from gateway.errors import NotFound, QuotaExceeded
from gateway.identity import Identity, MemoryMode
from gateway.memory import recall, rerank
from gateway.memory.archive import Archive, ArchiveCache, Indexed, index_messages, text_size
from gateway.memory.assemble import Context, Recalled, assemble, window_units
from gateway.memory.jobs import Job, schedule
from gateway.memory.model import Message, Pin, SessionState, Tiers
from gateway.memory.model_budget import ModelEntry, entry_for, model_budget
from gateway.memory.recent import Recent, RecentSet
from gateway.memory.reconcile import Reconciled, reconcile
from gateway.memory.tiers.pins import AUTO_PIN_IMPORTANCE, requested_pin
from gateway.metrics import tokens_sent
from gateway.request_log import current_request_id
from gateway.store.catalog import REFRESH_S, StoredReceipt
from gateway.store.keys import SessionKeys, UserKeys
from gateway.store.redis_store import (
    Joining,
    Known,
    Loaded,
    LogSlice,
    Predicted,
    RedisStore,
    StoreUnavailable,
    TailMoved,
)
from gateway.tokens import TokenCounter, uncounted_chars

log = logging.getLogger(__name__)

# A Lua script unpacks its arguments onto the stack; imports go in batches below that limit.
IMPORT_BATCH = 500
END_JOB = Job("end", 0, 0, 0)
# Records that lost a race for the tail and were planned again; each race needs another
# turn to land in between, so a few attempts are plenty.
RECORD_ATTEMPTS = 5
# The first pause before recording again when Redis was unavailable (doubling, to 0.5 s).
RETRY_PAUSE_S = 0.05
# Users and sessions remembered for prefetching (a few MB at most).
RECENT_ENTRIES = 10_000
# A load reads at most this many messages appended since what the process holds of the
# session; further behind, it reads the session again by pages of ARCHIVE_PAGE.
MOST_DELTA = 512
ARCHIVE_PAGE = 2_000
# Messages parsed and indexed at once on the event loop; more go to a thread, so that a
# long session read again does not hold up the other requests.
INLINE_MESSAGES = 256
# Messages embedded on the event loop when recorded (a turn's two): an import's batch is
# embedded in a thread.
INLINE_VECTORS = 4


# What recall reads of a long message to search with it: its beginning and its end (a
# question before or after a pasted document), so that building the query costs the same
# for a megabyte as for a page.
QUERY_CHARS = 16 * 1024


def _searched(text: str) -> str:
    if len(text) <= QUERY_CHARS:
        return text
    half = QUERY_CHARS // 2
    return text[:half] + "\n" + text[-half:]


def _query(messages: Sequence[Message]) -> str:
    """What recall searches for: the newest user message of the request."""
    return _searched(next((m.text for m in reversed(messages) if m.role == "user"), ""))


def _context(prior: Sequence[Message]) -> list[str]:
    """The turns a follow-up question may refer to: the last two messages before it."""
    return [_searched(m.text) for m in prior[-2:] if m.role in ("user", "assistant") and m.text]


def _build(
    archive: Archive, parts: Sequence[tuple[Sequence[Message], Sequence[bytes | None]]]
) -> Archive:
    for messages, raw_vectors in parts:
        archive.extend(messages, raw_vectors)
    return archive


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


def check_quota(used: int, quota: int) -> None:
    """Refuse to store more for a tenant at its quota (429)."""
    if used >= quota:
        raise QuotaExceeded(
            f"this tenant's memory is at its quota ({quota // 2**20} MB stored): "
            "erase sessions to free some, or ask the operator for more"
        )


def session_keys(identity: Identity) -> SessionKeys:
    return SessionKeys(identity.tenant, identity.session_id)


class MemoryService:
    def __init__(
        self,
        store: RedisStore,
        counter: TokenCounter,
        config: MemoryConfig,
        embedder: rerank.Embedder | None = None,
        *,
        vectors: StaticEmbedder | None = None,
        archives: ArchiveCache[SessionKeys] | None = None,
        models: Sequence[ModelEntry] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.counter = counter
        self.config = config
        self.models = models  # ``models:``: each model's window bounds its requests' budget
        self.composition: Composition = config.composition
        self.embedder = embedder  # the optional /v1/embeddings reranker
        tier = self.composition.recall
        # The in-process vectors recall fuses with words (None: words only).
        self.vectors = vectors if tier is not None and tier.semantic else None
        self.archives: ArchiveCache[SessionKeys] = archives or ArchiveCache(
            config.archive_cache_mb * 2**20
        )
        self.clock = clock
        # Prefetch hints, never trusted as data: which sessions a user's history named at
        # their last request (their archives come with the next load), and which sessions
        # are past the young-session age (no cross-session recall, nothing to prefetch).
        self._peers: Recent[UserKeys, tuple[SessionKeys, ...]] = Recent(RECENT_ENTRIES)
        self._grown: RecentSet[SessionKeys] = RecentSet(RECENT_ENTRIES)

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

    async def _counted_off_loop(
        self, messages: tuple[Message, ...], model: str
    ) -> tuple[Message, ...]:
        """``_counted``, in the heavy-work pool when there is much to count (a long message:
        tokenizing a megabyte takes from a tenth of a second to seconds)."""
        return await offload.sized(uncounted_chars(messages), self._counted, messages, model, {})

    async def prepare(
        self,
        identity: Identity,
        messages: tuple[Message, ...],
        model: str,
        *,
        requested_output: int | None = None,
        budget_tokens: int | None = None,
    ) -> Turn:
        """Load the session and plan the context (raises ``StoreUnavailable``), within
        ``budget_tokens`` when given (a retry's), else the smaller of
        ``memory.budget_tokens`` and what the model can take with room for an answer of
        ``requested_output`` tokens (``model_budget``).

        One round trip, usually: the load brings what was appended to the session since
        this process last read it (recall searches the archive it holds in memory), and
        the same of the user's earlier sessions this process saw named at their last
        request.
        """
        keys = session_keys(identity)
        composition = self.composition
        tier = composition.recall
        query = _query(messages) if tier is not None else ""
        user = self._user_keys(identity)
        young_tier = composition.cross_session
        maybe_young = young_tier is not None and keys not in self._grown
        peers: tuple[SessionKeys, ...] = ()
        if user is not None and query and maybe_young and tier is not None:
            peers = self._peers.get(user, ())
        held = self.archives.get(keys) if tier is not None else None
        loaded = await self.store.load_turn(
            keys,
            self.config.reconcile_tail,
            known=Known(held.generation, held.count) if held is not None else None,
            vectors=self.vectors is not None,
            most=MOST_DELTA,
            user=user,
            peers=[(peer, self._known(peer)) for peer in peers],
            usage=identity.quota_bytes is not None and identity.mode is MemoryMode.ON,
        )
        if loaded.usage is not None and identity.quota_bytes is not None:
            check_quota(loaded.usage, identity.quota_bytes)
        state = loaded.state
        if identity.users is not None and state.exists and state.user_id not in identity.users:
            # Another user's session, to a key limited to its users: as if it did not exist.
            raise NotFound(f"session {identity.session_id!r} not found", param="session_id")
        archive = None
        if tier is not None:
            archive = await self._archive(keys, loaded.log, held, tier)
            state = replace(state, tail=archive.tail(self.config.reconcile_tail))
        plan = await self._plan_off_loop(messages, state, model)
        young = young_tier is not None and state.message_count < young_tier.young_session_messages
        if young_tier is not None and not young:
            self._grown.add(keys)  # sessions only grow: no more prefetching for this one
        recalled: Iterable[Recalled] = ()
        if tier is not None and archive is not None and query:
            others = await self._elsewhere(keys, user, loaded, tier) if young else {}
            recalled = await self._recall(
                keys, archive, others, plan, state.tiers, query, tier, model
            )
        context = assemble(
            plan,
            tiers=state.tiers,
            pins=state.pins,
            composition=composition,
            budget_tokens=self.budget_for(model, requested_output)
            if budget_tokens is None
            else budget_tokens,
            memory_role=self.config.memory_role,
            count=self.counter.for_model(model),
            recalled=recalled,
            profile=state.profile if young else None,
            now=self.clock(),
        )
        sent = tokens_sent(messages, plan)
        return Turn(keys, identity, state, plan, context, model, messages, sent)

    def budget_for(self, model: str, requested_output: int | None = None) -> int:
        """A request's budget: ``memory.budget_tokens``, or less for a model whose
        ``models:`` entry says its window is smaller."""
        if not self.models:
            return self.config.budget_tokens
        entry = entry_for(model, self.models)
        return model_budget(self.config.budget_tokens, entry, requested_output)

    def _known(self, keys: SessionKeys) -> Known | None:
        held = self.archives.get(keys)
        return Known(held.generation, held.count) if held is not None else None

    async def _archive(
        self, keys: SessionKeys, log: LogSlice, held: Archive | None, tier: RecallTier
    ) -> Archive:
        """The session's archive as of this load: what the process held, with what was
        appended since (the usual case), or read again (see ``memory.archive``)."""
        current = self.archives.get(keys)
        indexed: list[Indexed] = []
        if log.warm and current is not None and current is held:
            indexed = await self._indexed(log.messages)
            # Looked at again: a long message was indexed off the loop, and another
            # request may have changed what is held meanwhile.
            current = self.archives.get(keys)
        if log.warm and current is not None and current is held:
            if current.generation != log.generation:  # its end was replaced: drop that
                current.truncate(log.start)
                current.generation = log.generation
            skip = current.count - log.start  # read here, but already held
            if 0 <= skip <= len(log.messages):
                current.extend(log.messages[skip:], log.vectors[skip:], indexed[skip:])
                self.archives.resized(keys)
                return current
        if (
            current is not None
            and current.generation == log.generation
            and current.count == log.count
        ):
            return current  # another request brought it up to date meanwhile
        return await self._read_archive(keys, log, tier)

    async def _read_archive(self, keys: SessionKeys, log: LogSlice, tier: RecallTier) -> Archive:
        """The archive read again: the messages before the slice the load read, by pages,
        then the slice; held from now on (not when the log changed while being read)."""
        first = max(0, log.count - tier.archive_messages)
        archive = Archive(log.generation, first + 1)
        if not log.generation:  # no such session (yet, or any more: erased, expired)
            self.archives.discard(keys)
            return archive
        parts: list[tuple[Sequence[Message], Sequence[bytes | None]]] = []
        for start in range(first, log.start, ARCHIVE_PAGE):
            stop = min(start + ARCHIVE_PAGE, log.start) - 1
            generation, _, messages, raw = await self.store.archive_page(
                keys, start, stop, vectors=self.vectors is not None
            )
            if generation != log.generation:
                # Rewritten meanwhile: this request searches what it loaded, and the next
                # one reads the session again.
                alone = Archive(log.generation, log.start + 1)
                return _build(alone, [await self._embedded(log.messages, log.vectors)])
            parts.append(await self._embedded(messages, raw))
        kept = max(0, first - log.start)  # a slice longer than the archive's limit
        parts.append(await self._embedded(log.messages[kept:], log.vectors[kept:]))
        if (
            sum(len(m) for m, _ in parts) > INLINE_MESSAGES
            or sum(text_size(m) for m, _ in parts) >= offload.HEAVY_CHARS
        ):
            archive = await asyncio.to_thread(_build, archive, parts)
        else:
            _build(archive, parts)
        self.archives.put(keys, archive)
        return archive

    async def _embedded(
        self, messages: Sequence[Message], raw: Sequence[bytes | None]
    ) -> tuple[Sequence[Message], Sequence[bytes | None]]:
        """The messages with a vector each: those stored without one (recorded by a
        version before vectors, or by a gateway without them) get one made here."""
        if self.vectors is None or all(v is not None for v in raw):
            return messages, raw
        missing = [i for i, v in enumerate(raw) if v is None]
        made = await self._encode([messages[i] for i in missing])
        filled = list(raw)
        for i, vector in zip(missing, made, strict=True):
            filled[i] = vector or None
        return messages, filled

    async def _encode(self, messages: Sequence[Message]) -> list[bytes]:
        """The messages' vectors in their stored form (b"" each without ``vectors``)."""
        if self.vectors is None or not messages:
            return [b""] * len(messages)
        texts = [m.text for m in messages]
        if len(texts) <= INLINE_VECTORS:
            return self.vectors.encode(texts)
        return await asyncio.to_thread(self.vectors.encode, texts)

    async def _indexed(self, messages: Sequence[Message]) -> list[Indexed]:
        """The messages' terms for recall: off the loop for long messages."""
        return await offload.sized(text_size(messages), index_messages, messages)

    def _plan(self, messages: tuple[Message, ...], state: SessionState, model: str) -> Reconciled:
        return self._count_plan(reconcile(messages, state), model)

    async def _plan_off_loop(
        self, messages: tuple[Message, ...], state: SessionState, model: str
    ) -> Reconciled:
        """``_plan``, counting in the heavy-work pool when this turn brings much text."""
        plan = reconcile(messages, state)
        brought = (*plan.prompt, *plan.prior, *plan.to_record, *plan.new)
        return await offload.sized(uncounted_chars(brought), self._count_plan, plan, model)

    def _count_plan(self, plan: Reconciled, model: str) -> Reconciled:
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
        archive: Archive,
        others: dict[SessionKeys, Archive],
        plan: Reconciled,
        tiers: Tiers,
        query: str,
        tier: RecallTier,
        model: str,
    ) -> Iterator[Recalled]:
        """The archive's messages that best match the new user message, best first,
        outside the window (and, for a young session, its user's earlier sessions')."""
        shown = {m.index for unit in window_units(plan, tiers, self.composition) for m in unit}
        shown |= {m.index for m in plan.new if m.index}
        unseen = len(archive.messages) - sum(archive.first <= i <= archive.count for i in shown)
        if not unseen and not others:
            return iter(())  # a short session is all in the window: nothing to look for
        sources = [recall.Source(archive, frozenset(shown))]
        sessions: list[str | None] = [None]
        for peer, peer_archive in others.items():
            sources.append(recall.Source(peer_archive))
            sessions.append(peer.session_id)
        searched = [source.archive for source in sources]
        built = recall.build_query(
            query,
            _context(plan.prior),
            known=recall.vocabulary(searched),
            embed=self.vectors.query if self.vectors is not None else None,
        )
        weights = recall.Weights(
            semantic=tier.semantic_weight if self.vectors is not None else 0.0,
            neighbour=tier.neighbour_weight,
        )
        # Enough hits to fill the budget with short lines (a line is ~25 tokens).
        limit = max(64, self.config.budget_tokens // 12)
        hits = [
            hit
            for hit in recall.rank(sources, built, limit=limit, weights=weights)
            if hit.score >= tier.min_score
        ]
        if tier.embeddings is not None and self.embedder is not None and len(hits) > 1:
            hits = await self._rerank(keys, query, hits, tier.embeddings)
        return self._resolved(hits, sources, sessions, model)

    def _resolved(
        self,
        hits: Sequence[recall.Hit],
        sources: Sequence[recall.Source],
        sessions: Sequence[str | None],
        model: str,
    ) -> Iterator[Recalled]:
        """The hits as messages, made as ``assemble`` reads them."""
        for hit in hits:
            source = sources[hit.source].archive
            message = source.message(hit.index)
            if message is None:
                continue
            lead_in = recall.lead_in(source, hit.index)
            # Stored messages carry their count: only one stored without it is counted.
            if not message.tokens:
                (message,) = self._counted((message,), model, {})
            if lead_in is not None and not lead_in.tokens:
                (lead_in,) = self._counted((lead_in,), model, {})
            yield Recalled(message, sessions[hit.source], hit.score, lead_in)

    async def _rerank(
        self, keys: SessionKeys, query: str, hits: list[recall.Hit], config: EmbeddingsConfig
    ) -> list[recall.Hit]:
        """The best candidates reordered by the embeddings model; on any failure, as they
        were."""
        assert self.embedder is not None
        head, rest = hits[: config.candidates], hits[config.candidates :]
        try:
            async with asyncio.timeout(config.timeout_s):
                (vector,) = await self.embedder.embed([query])
        except (rerank.EmbeddingsUnavailable, TimeoutError) as error:
            log.warning("recall not reranked: %s", error)
            return hits
        own = [hit.index for hit in head if hit.source == 0]
        stored = await self.store.vectors(keys, own)
        vectors = {index: rerank.unpack(raw) for index, raw in stored.items()}
        return rerank.rerank(head, vector, vectors, weight=config.weight) + rest

    async def _elsewhere(
        self, keys: SessionKeys, user: UserKeys | None, loaded: Loaded, tier: RecallTier
    ) -> dict[SessionKeys, Archive]:
        """The archives of the user's ended sessions their history names (as loaded with
        this request), for a young session to recall from. Those the load brought are
        brought up to date; one it did not (the history changed since this process last
        saw it) is read now. A prefetched one the history no longer names (erased) is
        ignored."""
        if user is None or not tier.across_sessions or not loaded.state.history:
            return {}
        sessions = [
            SessionKeys(keys.tenant, entry["session_id"])
            for entry in loaded.state.history
            if entry.get("session_id") and entry["session_id"] != keys.session_id
        ]
        self._peers.put(user, tuple(sessions))
        found = {}
        for session in sessions:
            log = loaded.peers.get(session)
            if log is None:  # not prefetched: its length and generation first
                generation, count, _, _ = await self.store.archive_page(
                    session, 0, -1, vectors=False
                )
                log = LogSlice(generation, count, count, False, (), ())
            held = self.archives.get(session)
            found[session] = await self._archive(session, log, held, tier)
        return found

    async def record(
        self, turn: Turn, answer: Message, *, now: float, retry_s: float = 0.0
    ) -> None:
        """Append this turn's new messages and the answer atomically, with their jobs.

        A plan that relied on the stored tail is made again when a concurrent turn landed
        first (``TailMoved``); after ``RECORD_ATTEMPTS`` such races the turn is not recorded
        (the caller reports it degraded) rather than recorded twice.

        Redis unavailable (``StoreUnavailable``) is retried for up to ``retry_s``: a Redis
        restarting takes a moment, and the answer's acknowledgement waits for its record.
        Every attempt carries the turn's record id, so one whose reply was lost (Redis
        went away after running it) is not appended again by the next.
        """
        (answer,) = await self._counted_off_loop((answer,), turn.model)
        record_id = secrets.token_hex(12)
        deadline = time.monotonic() + retry_s
        pause = RETRY_PAUSE_S
        while True:
            try:
                await self._record_once(turn, answer, now, record_id)
                return
            except StoreUnavailable:
                if time.monotonic() + pause > deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(2 * pause, 0.5)

    async def _record_once(self, turn: Turn, answer: Message, now: float, record_id: str) -> None:
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
                    receipt=receipt,
                    record_id=record_id,
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
            batch = await self._counted_off_loop(messages[start : start + IMPORT_BATCH], model)
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
        receipt: StoredReceipt | None = None,
        record_id: str = "",
    ) -> SessionState:
        """Record ``messages`` after the ``stored`` state, with the jobs and pins they make
        due, in one round trip when the log is as ``stored`` says (see ``Predicted``). A
        session new to its user finds their idle sessions in that round trip too.

        Messages keep the time they carry (an import's); the others are stamped ``now``.

        Returns what is known of the session afterwards (its count, turns, user and tail).
        """
        stamped = tuple(m if m.ts > 0 else m.but(ts=now) for m in messages)
        vectors = await self._encode(stamped) if self.vectors is not None else []
        before = (
            stored.message_count if truncate_to is None else min(stored.message_count, truncate_to)
        )
        expected = self._writes(stored.tail, stamped, before, stored.turns, now)
        user = UserKeys(keys.tenant, user_id) if user_id else None
        cross = self.composition.cross_session
        recorded = await self.store.record(
            keys,
            stamped,
            now=now,
            user_id=user_id,
            truncate_to=truncate_to,
            expected_count=expected_count,
            vectors=vectors,
            predicted=expected,
            joining=self._joining(user, stored, now),
            receipt=receipt,
            listed=now - stored.updated >= REFRESH_S,
            record_id=record_id,
            active=user if cross is not None else None,
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
            if foreseen and cross is not None:
                await self._end_sessions(user, recorded.idle)
            else:
                await self._end_idle_sessions(user, keys, now)
        appended = tuple(m.but(index=recorded.first + i) for i, m in enumerate(stamped))
        await self._held_grows(keys, recorded.generation, appended, vectors)
        history = tuple(m for m in stored.tail if m.index < recorded.first) + appended
        return replace(
            stored,
            message_count=recorded.count,
            turns=recorded.turns,
            user_id=user_id or stored.user_id,
            tail=history[-self.config.reconcile_tail :],
        )

    async def _held_grows(
        self,
        keys: SessionKeys,
        generation: str,
        appended: tuple[Message, ...],
        vectors: Sequence[bytes],
    ) -> None:
        """What the process holds of the session takes the messages just recorded, when
        they follow it directly (so the next load reads nothing more); otherwise the next
        load brings whatever it misses."""
        if not appended or self.archives.get(keys) is None:
            return
        indexed = await self._indexed(appended)
        held = self.archives.get(keys)  # (again: a long message was indexed off the loop)
        if held is None:
            return
        if held.generation == generation and held.count == appended[0].index - 1:
            held.extend(appended, vectors or [None] * len(appended), indexed)
            self.archives.resized(keys)

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

    def _joining(self, user: UserKeys | None, stored: SessionState, now: float) -> Joining | None:
        """A session new to its user joins their index in the record's round trip, and
        (with cross-session memory) finds those of their sessions gone idle there too."""
        if user is None or user.user_id == stored.user_id:
            return None
        cross = self.composition.cross_session
        return Joining(user, None if cross is None else now - cross.idle_end_s)

    async def _end_idle_sessions(self, user: UserKeys, keys: SessionKeys, now: float) -> None:
        """A user starting a session ends their idle ones (seed 001's end of session), so
        their final summaries reach the cross-session profile; the worker does the work."""
        cross = self.composition.cross_session
        if cross is None:
            return
        idle = await self.store.idle_sessions(
            user, idle_before=now - cross.idle_end_s, exclude=keys.session_id
        )
        await self._end_sessions(user, idle)

    async def _end_sessions(self, user: UserKeys, session_ids: Sequence[str]) -> None:
        await self.store.end_sessions(user, session_ids, END_JOB)


def auto_pin(content: str, source_index: int, now: float) -> Pin:
    """A pin the user asked for in a message; its id is derived, so a retry re-pins nothing."""
    digest = hashlib.sha256(f"{source_index}:{content}".encode()).hexdigest()[:12]
    return Pin(f"pin_auto_{digest}", content, AUTO_PIN_IMPORTANCE, source_index, "auto", now)
