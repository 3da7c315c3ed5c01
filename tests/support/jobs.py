"""The job stream's notices as tests read them: every shard."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


@contextmanager
def notices_withdrawn(connect: Callable[[], Any]) -> Iterator[None]:
    """Withdraw the notices announced meanwhile: the jobs a test leaves pending are
    announced on the suite's shared stream, and a later test's in-process worker would
    otherwise run them all first (and change other sessions under that test's eyes)."""
    client = connect()
    before = {entry for _, entry, _ in notices(client)}
    try:
        yield
    finally:
        for stream, entry, _ in list(notices(client)):
            if entry not in before:
                client.xdel(stream, entry)
        client.close()
