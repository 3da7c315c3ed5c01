"""Recall for one request: the archive's messages that best match its newest question,
reranked by an embeddings model or the in-process sentence encoder when one is
configured."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence

from gateway.errors import EmbeddingsUnavailable
from gateway.memory import recall, rerank
from gateway.memory.archive import Archive, day_of
from gateway.memory.assemble import Recalled, window_units
from gateway.memory.fact_keys import fact_lifts
from gateway.memory.model import Message, Tiers
from gateway.memory.reconcile import Reconciled
from gateway.presets import Composition, EmbeddingsConfig, EncoderConfig, RecallTier
from gateway.service.planning import Planner
from gateway.service.ports import Embedder, SessionStore
from gateway.store.keys import SessionKeys
from gateway.text.embedder import StaticEmbedder

log = logging.getLogger(__name__)

_new = tuple.__new__

# What recall reads of a long message to search with it: its beginning and its end (a
# question before or after a pasted document), so that building the query costs the same
# for a megabyte as for a page.
QUERY_CHARS = 16 * 1024


def _searched(text: str) -> str:
    if len(text) <= QUERY_CHARS:
        return text
    half = QUERY_CHARS // 2
    return text[:half] + "\n" + text[-half:]


def query_of(messages: Sequence[Message]) -> str:
    """What recall searches for: the newest user message of the request."""
    return _searched(next((m.recall_text for m in reversed(messages) if m.role == "user"), ""))


def _context(prior: Sequence[Message]) -> list[str]:
    """The turns a follow-up question may refer to: the last two messages before it."""
    said = (m.recall_text for m in prior[-2:] if m.role in ("user", "assistant"))
    return [_searched(text) for text in said if text]


def _today(plan: Reconciled, archives: Sequence[Archive]) -> int:
    """The conversation's present, which "yesterday" and "last week" are read from: the
    day of the new user message when it says when it was sent, else of the newest
    message recorded in the archives searched (not the clock's: an imported conversation
    lies in the past)."""
    sent = next((m.ts for m in reversed(plan.new) if m.role == "user" and m.ts > 0), 0.0)
    if sent <= 0:
        sent = max((a.messages[-1].ts for a in archives if a.messages), default=0.0)
    return day_of(sent)


class Recall:
    def __init__(
        self,
        store: SessionStore,
        planner: Planner,
        composition: Composition,
        budget_tokens: int,
        *,
        vectors: StaticEmbedder | None,
        embedder: Embedder | None,
    ) -> None:
        self.store = store
        self.planner = planner
        self.composition = composition
        self.budget_tokens = budget_tokens
        self.vectors = vectors  # fused with words (None: words only)
        self.embedder = embedder  # the optional reranker: /v1/embeddings or the encoder

    async def search(
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
        cut = plan.truncate_to if plan.branch_from is None else plan.branch_from
        if cut is not None:  # what this turn takes off the log is not recalled either
            shown |= set(range(cut + 1, archive.count + 1))
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
            today=_today(plan, searched),
        )
        if tier.fact_keys:  # (the session's own facts: of its own archive)
            lifts = fact_lifts(archive, tiers.facts, built.terms, sources[0].exclude)
            sources[0] = recall.Source(archive, sources[0].exclude, lifts)
        weights = recall.Weights(
            semantic=tier.semantic_weight if self.vectors is not None else 0.0,
            neighbour=tier.neighbour_weight,
        )
        reranker = tier.reranker
        # Enough hits to fill the budget with short lines (a line is ~25 tokens), and as
        # many as a reranker reorders: its candidates come from these.
        limit = max(64, self.budget_tokens // 12, reranker.candidates if reranker else 0)
        hits = [
            hit
            for hit in recall.rank(sources, built, limit=limit, weights=weights)
            if hit.score >= tier.min_score
        ]
        if reranker is not None and self.embedder is not None and len(hits) > 1:
            hits = await self._rerank(keys, query, hits, reranker)
        return self._resolved(hits, sources, sessions, model)

    def _resolved(
        self,
        hits: Sequence[recall.Hit],
        sources: Sequence[recall.Source],
        sessions: Sequence[str | None],
        model: str,
    ) -> Iterator[Recalled]:
        """The hits as messages, made as ``assemble`` reads them: one at a time, as far as
        its budget goes (a long session's turn reads a hundred and more)."""
        archives = [source.archive for source in sources]
        for hit in hits:
            source = archives[hit.source]
            found = recall.with_lead_in(source, hit.index)
            if found is None:
                continue
            message, lead_in = found
            # Stored messages carry their count: only one stored without it is counted.
            if not message.tokens:
                (message,) = self.planner.counted((message,), model, {})
            if lead_in is not None and not lead_in.tokens:
                (lead_in,) = self.planner.counted((lead_in,), model, {})
            # (``tuple.__new__``: a named tuple's own constructor is a Python function, at
            # twice the cost.)
            yield _new(Recalled, (message, sessions[hit.source], hit.score, lead_in, source))

    async def _rerank(
        self,
        keys: SessionKeys,
        query: str,
        hits: list[recall.Hit],
        config: EmbeddingsConfig | EncoderConfig,
    ) -> list[recall.Hit]:
        """The best candidates reordered by the embeddings model; on any failure, as they
        were."""
        assert self.embedder is not None
        head, rest = hits[: config.candidates], hits[config.candidates :]
        try:
            async with asyncio.timeout(config.timeout_s):
                (vector,) = await self.embedder.embed([query])
        except (EmbeddingsUnavailable, TimeoutError) as error:
            log.warning("recall not reranked: %s", error)
            return hits
        own = [hit.index for hit in head if hit.source == 0]
        stored = await self.store.vectors(keys, own)
        vectors = {index: rerank.unpacked(raw) for index, raw in stored.items()}
        return rerank.rerank(head, vector, vectors, weight=config.weight) + rest
