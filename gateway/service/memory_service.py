"""Runs the memory policy for one request: load, reconcile, recall, assemble; later,
record (its ``recorder``). One round trip each, usually."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from gateway.auth.identity import Identity, MemoryMode
from gateway.caching import BoundedSet
from gateway.config import MemoryConfig, PromptCacheConfig
from gateway.errors import NotFound
from gateway.memory.accounting import tokens_sent
from gateway.memory.archive import Archive, ArchiveCache
from gateway.memory.assemble import Context, Recalled
from gateway.memory.branches import facts_after_branch
from gateway.memory.images import Blob
from gateway.memory.layout import build_context
from gateway.memory.model import Message
from gateway.memory.model_budget import ModelEntry, entry_for, model_budget
from gateway.memory.prompt_cache import cacheable_tokens, shared_tokens
from gateway.presets import Composition
from gateway.service.archives import MOST_DELTA, RECENT_ENTRIES, Archives
from gateway.service.planning import Planner
from gateway.service.ports import Embedder, Store
from gateway.service.recalling import Recall, query_of
from gateway.service.recording import Recorder, check_record_size
from gateway.service.turn import (
    HOLD_S,
    Turn,
    another_users,
    forwarded_print,
    incoming,
    over_quota,
    session_keys,
)
from gateway.service.turn_images import Images, ingested
from gateway.store.keys import SessionKeys, UserKeys
from gateway.store.redis_store import Ask, Held, Known, Loaded, StoreUnavailable
from gateway.text.embedder import StaticEmbedder
from gateway.text.tokens import TokenCounter

log = logging.getLogger(__name__)


class MemoryService:
    """Plans a request's turn (``prepare``); its ``recorder`` records turns and imports."""

    def __init__(
        self,
        store: Store,
        counter: TokenCounter,
        config: MemoryConfig,
        embedder: Embedder | None = None,
        *,
        vectors: StaticEmbedder | None = None,
        archives: ArchiveCache[SessionKeys] | None = None,
        models: Sequence[ModelEntry] = (),
        clock: Callable[[], float] = time.time,
        max_request_bytes: int = 32 * 2**20,
        prompt_cache: PromptCacheConfig | None = None,
    ) -> None:
        self.store = store
        self.prompt_cache = prompt_cache or PromptCacheConfig()
        self.counter = counter
        self.config = config
        self.models = models  # ``models:``: each model's window bounds its requests' budget
        self.composition: Composition = config.composition
        tier = self.composition.recall
        # The in-process vectors recall fuses with words (None: words only).
        vectors = vectors if tier is not None and tier.semantic else None
        self.archives: ArchiveCache[SessionKeys] = archives or ArchiveCache(
            config.archive_cache_mb * 2**20
        )
        self.clock = clock
        self._planner = Planner(counter, clock)
        self._held = Archives(store.sessions, self.archives, vectors)
        self._recall = Recall(
            store.sessions,
            self._planner,
            self.composition,
            config.budget_tokens,
            vectors=vectors,
            embedder=embedder,
        )
        self._images = Images(store.sessions, counter, config.media, max_request_bytes)
        # Records turns (the proxy's ``TurnService``) and imports (the memory API).
        self.recorder = Recorder(
            store, config, self.composition, self._planner, self._held, self._images
        )
        # A prefetch hint, never trusted as data: the sessions past the young-session age
        # (no cross-session recall, nothing to prefetch).
        self._grown: BoundedSet[SessionKeys] = BoundedSet(RECENT_ENTRIES)
        # Holds given back in the background, kept here until done (not garbage-collected).
        self._giving_back: set[asyncio.Future[None]] = set()

    @property
    def held(self) -> Archives:
        """The sessions' archives for recall (the memory API's search reads them too)."""
        return self._held

    async def prepare(
        self,
        identity: Identity,
        messages: tuple[Message, ...],
        model: str,
        *,
        requested_output: int | None = None,
        budget_tokens: int | None = None,
        held: Held | None = None,
    ) -> Turn:
        """Load the session and plan the context (raises ``StoreUnavailable``), within
        ``budget_tokens`` when given (a retry's), else the smaller of
        ``memory.budget_tokens`` and what the model can take with room for an answer of
        ``requested_output`` tokens (``model_budget``).

        A turn that records, of a tenant with a quota, has its new messages' bytes
        reserved against it in the load's round trip (``QuotaExceeded`` when they do not
        fit), unless it is planned again with what it ``held`` already (a retry's). Its
        record charges what it stores beyond them: a tenant passes its quota by at most
        that, the answer and any history the session did not hold, for each of its turns
        admitted at once.

        One round trip, usually: the load brings what was appended to the session since
        this process last read it (recall searches the archive it holds in memory), and
        the same of the user's earlier sessions this process saw named at their last
        request.
        """
        keys = session_keys(identity)
        sent = messages
        messages, blobs = await ingested(messages)
        composition = self.composition
        tier = composition.recall
        query = query_of(messages) if tier is not None else ""
        user = self._user_keys(identity)
        young_tier = composition.cross_session
        maybe_young = young_tier is not None and keys not in self._grown
        peers: tuple[SessionKeys, ...] = ()
        if user is not None and query and maybe_young and tier is not None:
            peers = self._held.peers(user, keys)
        archived = self.archives.get(keys) if tier is not None else None
        ask = None
        quota = identity.quota_bytes
        if held is None and quota is not None and identity.mode is MemoryMode.ON:
            ask = Ask(keys.tenant, self._incoming_bytes(messages, blobs), quota, HOLD_S)
        loaded = await self.store.sessions.load_turn(
            keys,
            self.config.reconcile_tail,
            known=Known(archived.generation, archived.count) if archived is not None else None,
            vectors=self._held.vectors is not None,
            most=MOST_DELTA,
            user=user,
            peers=[(peer, self._held.known(peer)) for peer in peers],
            reserve=ask,
            now=self.clock(),
        )
        if loaded.reservation is not None:
            if loaded.reservation.held is None and quota is not None:
                raise over_quota(quota)
            held = loaded.reservation.held
        try:
            turn = await self._planned(
                identity,
                loaded,
                archived,
                sent=sent,
                messages=messages,
                blobs=blobs,
                model=model,
                requested_output=requested_output,
                budget_tokens=budget_tokens,
                query=query,
                user=user,
            )
        except BaseException:
            if ask is not None and held is not None:
                self.give_back(keys.tenant, held)  # no turn to record: its hold goes back
            raise
        return replace(turn, held=held)

    async def _planned(
        self,
        identity: Identity,
        loaded: Loaded,
        archived: Archive | None,
        *,
        sent: tuple[Message, ...],
        messages: tuple[Message, ...],
        blobs: dict[str, Blob],
        model: str,
        requested_output: int | None,
        budget_tokens: int | None,
        query: str,
        user: UserKeys | None,
    ) -> Turn:
        """The turn's context planned from its ``loaded`` session (``prepare``)."""
        keys = session_keys(identity)
        composition = self.composition
        tier = composition.recall
        young_tier = composition.cross_session
        state = loaded.state
        if state.exists and not _users_session(state.user_id, identity):
            # Another user's session, to a key limited to its users or to a request naming
            # another user: as if it did not exist (its user is set once: record.lua).
            raise NotFound(f"session {identity.session_id!r} not found", param="session_id")
        archive = None
        if tier is not None:
            archive = await self._held.archive(keys, loaded.log, archived, tier)
            if user is not None and tier.across_sessions:
                self._held.seen(user, keys)  # prefetched for their next new session
            state = replace(state, tail=archive.tail(self.config.reconcile_tail))
        plan = await self._planner.plan(messages, state, model)
        if identity.mode is MemoryMode.ON:
            check_record_size(plan.to_record, self.config.max_record_bytes)
        if plan.branch_from is not None:  # an edit: facts read from what it abandons go
            cut = facts_after_branch(state.tiers, plan.branch_from, plan.branch_from)
            state = state if cut is None else replace(state, tiers=cut[0])
        young = young_tier is not None and state.message_count < young_tier.young_session_messages
        if young_tier is not None and not young:
            self._grown.add(keys)  # sessions only grow: no more prefetching for this one
        recalled: Iterable[Recalled] = ()
        if tier is not None and archive is not None and query:
            others = await self._held.elsewhere(keys, user, loaded, tier) if young else {}
            recalled = await self._recall.search(
                keys, archive, others, plan, state.tiers, query, tier, model
            )
        context = build_context(
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
        forwarded = forwarded_print(context)
        context = self._with_stable(context, forwarded, state.forwarded)
        context = await self._images.hydrated(keys, context, blobs, plan, model)
        tokens = tokens_sent(messages, plan)
        return Turn(
            keys,
            identity,
            state,
            plan,
            context,
            model,
            sent,
            tokens,
            messages,
            blobs,
            requested_output,
            forwarded,
        )

    def _incoming_bytes(self, messages: Sequence[Message], blobs: Mapping[str, Blob]) -> int:
        """The bytes a turn reserves of its tenant's quota: its new messages as the record
        stores them (``incoming``), with their images."""
        new = incoming(messages)
        stored = sum(len(message.to_json()) for message in new)
        return stored + sum(len(blob.data) for blob in self._images.kept(new, blobs))

    def give_back(self, tenant: str, held: Held) -> None:
        """A hold on ``tenant``'s quota returned unused (its turn will not record), in the
        background: a request refused or cancelled does not wait for it. Should Redis not
        take it, the hold expires (``HOLD_S``)."""
        task = asyncio.ensure_future(self._give_back(tenant, held))
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)

    async def _give_back(self, tenant: str, held: Held) -> None:
        try:
            await self.store.quotas.give_back(tenant, held)
        except StoreUnavailable as error:
            log.warning("a hold on a quota was not given back (it expires): %s", error)

    def _with_stable(self, context: Context, forwarded: str, previous: str) -> Context:
        """The context, its receipt saying how much of it the upstream can reuse from what
        the session forwarded last (``upstream.prompt_cache``; none known: ``None``)."""
        if not previous:
            return context
        cache = self.prompt_cache
        stable = cacheable_tokens(
            cache.policy,
            shared_tokens(forwarded, previous),
            minimum=cache.minimum_tokens,
            step=cache.step_tokens,
        )
        return replace(context, receipt=replace(context.receipt, stable=stable))

    def budget_for(self, model: str, requested_output: int | None = None) -> int:
        """A request's budget: ``memory.budget_tokens``, or less for a model whose
        ``models:`` entry says its window is smaller."""
        if not self.models:
            return self.config.budget_tokens
        entry = entry_for(model, self.models)
        return model_budget(self.config.budget_tokens, entry, requested_output)

    def _user_keys(self, identity: Identity) -> UserKeys | None:
        composition = self.composition
        wants_user = composition.cross_session is not None or (
            composition.recall is not None and composition.recall.across_sessions
        )
        if identity.user_id is None or not wants_user:
            return None
        return UserKeys(identity.tenant, identity.user_id)


def _users_session(owner: str | None, identity: Identity) -> bool:
    """Whether a session of ``owner`` (None: no user yet) is open to this request."""
    if identity.users is not None and owner not in identity.users:
        return False
    return not another_users(owner, identity.user_id)
