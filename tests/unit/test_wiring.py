"""gateway/wiring.py: the store's two clients, made as the request path and the
background each need (their timeouts bound their connects too)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import Settings
from gateway.memory.model import Message
from gateway.store.link import MAX_QUEUED_S
from gateway.wiring import Clients, build_clients


@pytest.fixture
async def clients() -> Any:
    made = build_clients(Settings(), "redis://127.0.0.1:1/0")  # nothing connects here
    yield made
    await made.aclose()


def _made_with(client: Any) -> tuple[dict[str, Any], int]:
    pool = client.connection_pool
    return pool.connection_kwargs, pool.max_connections


async def test_the_request_paths_client_connects_within_a_second_or_so(clients: Clients) -> None:
    settings = Settings()
    kwargs, pool_size = _made_with(clients.store.client)
    short = settings.redis.timeout_ms / 1000 + MAX_QUEUED_S
    # Its link's connections are made with these settings: a connect gives up as soon.
    assert kwargs["socket_connect_timeout"] == pytest.approx(short)
    assert kwargs["socket_timeout"] == pytest.approx(short)
    assert pool_size == settings.redis.max_connections


async def test_the_backgrounds_client_waits_out_a_blocking_read(clients: Clients) -> None:
    worker = Settings().worker
    kwargs, pool_size = _made_with(clients.job_store.client)
    assert kwargs["socket_timeout"] == pytest.approx(
        worker.redis_timeout_s + worker.block_ms / 1000
    )
    # A blocking read per shard, and the jobs' own calls.
    assert pool_size == worker.job_shards + worker.concurrency * 2 + 4
    assert clients.job_store.client is not clients.store.client


async def test_no_summarizer_model_means_extracts_and_no_model_call() -> None:
    """``summarizer.model: null`` (a local single-slot server, whose summaries would queue
    in front of every chat turn): every summary is a model-free extract, at once."""
    settings = Settings.model_validate({"summarizer": {"model": None}})
    made = build_clients(settings, "redis://127.0.0.1:1/0")
    try:
        assert made.summarizer.model is None
        written = await made.summarizer.chunk([Message("user", "We fly to Lisbon on May 3.")])
        assert "Lisbon" in written.text
    finally:
        await made.aclose()
    default = build_clients(Settings(), "redis://127.0.0.1:1/0")
    try:
        assert default.summarizer.model is default.chat_model
    finally:
        await default.aclose()
