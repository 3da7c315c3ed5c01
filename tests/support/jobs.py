"""The job stream's notices as tests read them: every shard."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gateway.config import WorkerConfig
from gateway.store.keys import job_stream

SHARDS = WorkerConfig().job_shards  # the default, as the tests' gateways run


def streams(shards: int = SHARDS) -> list[str]:
    return [job_stream(shard) for shard in range(shards)]


def notices(client: Any, shards: int = SHARDS) -> Iterator[tuple[str, bytes, dict[bytes, bytes]]]:
    """(stream, entry id, fields) of every notice in every shard, shard by shard."""
    for stream in streams(shards):
        for entry, fields in client.xrange(stream):
            yield stream, entry, fields
