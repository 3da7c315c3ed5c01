"""Building the long-lived clients from the settings (used by the CLI and by tests).

``create_app`` takes its clients ready-made; this module is where they are made, so the
CLI's ``serve`` and ``worker`` commands and the integration tests build them one way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette

from gateway.app import create_app
from gateway.config import Settings
from gateway.observability import metrics
from gateway.service.worker import JobRunner
from gateway.store.link import MAX_QUEUED_S, RedisLink
from gateway.store.redis_store import RedisStore, create_client
from gateway.summarize.summarizer import Summarizer
from gateway.text.embedder import StaticEmbedder
from gateway.text.encoder import EncoderUnavailable, LocalEmbeddings, SentenceEncoder
from gateway.text.tokens import TokenCounter
from gateway.upstream.client import Upstream
from gateway.upstream.models import UpstreamChatModel, UpstreamEmbeddings

log = logging.getLogger(__name__)


@dataclass
class Clients:
    upstream: Upstream
    # One store. Its calls are under the request path's deadline (100 ms); the worker's
    # and the memory API's under ``job_store``'s (seconds), on other connections.
    store: RedisStore
    job_store: RedisStore  # ``store.with_deadline(worker.redis_timeout_s)``: the same store
    chat_model: UpstreamChatModel
    summarizer: Summarizer
    tokenizer: TokenCounter
    embedder: UpstreamEmbeddings | LocalEmbeddings | None = None  # recall's reranker
    vectors: StaticEmbedder | None = None  # recall's in-process word vectors
    clock: Callable[[], float] = time.time  # what the app and the jobs read the time from
    anthropic: Upstream | None = None  # the Messages API's (``upstream.anthropic_base_url``)

    def runner(self, settings: Settings) -> JobRunner:
        # A job makes at most four summarizer calls (chunk, merge, facts; or fold + pair).
        lease_ms = int((settings.summarizer.timeout_s * 4 + 10) * 1000)
        return JobRunner(
            self.job_store,
            self.summarizer,
            settings.memory.composition,
            lease_ms=lease_ms,
            embedder=self.embedder,
            clock=self.clock,
            attempts=settings.worker.job_attempts,
            backoff_s=settings.worker.retry_backoff_s,
            # Held in between, a notice waiting this long is never taken for a dead one's.
            backoff_most_s=settings.worker.reclaim_idle_s / 2,
        )

    def create_app(
        self, settings: Settings, *, resources: AbstractAsyncContextManager[object] | None = None
    ) -> Starlette:
        return create_app(
            settings,
            upstream=self.upstream,
            store=self.store,
            tokenizer=self.tokenizer,
            runner=self.runner(settings),
            anthropic=self.anthropic,
            embedder=self.embedder,
            vectors=self.vectors,
            resources=resources,
            clock=self.clock,
        )

    async def aclose(self) -> None:
        await self.upstream.aclose()
        if self.anthropic is not None:
            await self.anthropic.aclose()
        await self.chat_model.aclose()
        await self.store.close()  # the job store's client and link too: they are its
        if self.embedder is not None:
            await self.embedder.aclose()


def build_clients(
    settings: Settings,
    redis_url: str,
    *,
    clock: Callable[[], float] = time.time,
    link: Callable[[Any], RedisLink] = RedisLink,
) -> Clients:
    """The clients of ``settings``; ``clock`` is the time the app and its jobs read;
    ``link`` makes each of the store's links from its client (a test's counts round
    trips)."""
    retention_s = int(settings.redis.retention_days * 86400)
    request_timeout = settings.redis.timeout_ms / 1000
    job_timeout = settings.worker.redis_timeout_s
    tokenizer = TokenCounter()
    summarizer_config = settings.summarizer
    chat_model = UpstreamChatModel(
        base_url=summarizer_config.base_url or settings.upstream.base_url,
        # Never a client's key: the configured summarizer key, else the upstream's.
        api_key=summarizer_config.api_key or settings.upstream.api_key,
        model=summarizer_config.model or "",
        timeout_s=summarizer_config.timeout_s,
        temperature=summarizer_config.temperature,
    )
    recall = settings.memory.composition.recall
    embeddings = recall.embeddings if recall is not None else None
    embedder: UpstreamEmbeddings | LocalEmbeddings | None = None
    if embeddings is not None:
        embedder = UpstreamEmbeddings(
            base_url=embeddings.base_url or settings.upstream.base_url,
            api_key=embeddings.api_key or settings.upstream.api_key,
            model=embeddings.model,
            timeout_s=embeddings.timeout_s,
        )
    elif recall is not None and recall.encoder is not None:
        try:
            embedder = LocalEmbeddings(SentenceEncoder.load(recall.encoder.path))
        except EncoderUnavailable as error:
            # An optional package: without it recall keeps its words and word vectors.
            log.warning("recall's sentence encoder is off: %s", error)
    vectors = None
    if recall is not None and recall.semantic:
        vectors = StaticEmbedder.load()
    # Two clients, one per channel of the store, each with its own connections. The
    # request path's: its socket timeout (also its connects', and on a cluster the slot
    # map's first read) leaves room for the link's allowance to a busy Redis and no more
    # (the link's connections have no socket timeout of their own: each call's deadline
    # bounds it). The background's (the worker, the memory API): its timeout waits out a
    # blocking stream read, its pool has room for one per shard and the jobs' own calls.
    worker = settings.worker
    request_client = create_client(
        redis_url,
        timeout_s=request_timeout + MAX_QUEUED_S,
        max_connections=settings.redis.max_connections,
        cluster=settings.redis.cluster,
    )
    background_client = create_client(
        redis_url,
        timeout_s=job_timeout + worker.block_ms / 1000,
        max_connections=worker.job_shards + worker.concurrency * 2 + 4,
        cluster=settings.redis.cluster,
    )
    store = RedisStore(
        request_client,
        timeout_s=request_timeout,
        retention_s=retention_s,
        job_shards=worker.job_shards,
        link=link(request_client),
        background=background_client,
        background_link=link(background_client),
    )
    return Clients(
        embedder=embedder,
        vectors=vectors,
        upstream=Upstream(settings.upstream),
        anthropic=Upstream.anthropic(settings.upstream),
        store=store,
        job_store=store.with_deadline(job_timeout),
        chat_model=chat_model,
        # No model (``summarizer.model: null``): summaries and facts are extracts, at once.
        summarizer=Summarizer(
            chat_model if summarizer_config.model else None,
            tokenizer,
            outcome=metrics.summary_outcome,
        ),
        tokenizer=tokenizer,
        clock=clock,
    )
