"""The integration and system tests' fixtures: a private redis-server, a real fake upstream,
gateways on sockets (a pytest plugin: tests/conftest.py loads it).

Every bearer key a test uses comes from ``api_key`` and is registered; when the session
ends, every Redis key and value and every log record captured is scanned for those keys
(and for any 8-character piece of one). Finding one fails the run.

Message content must not be logged at INFO or above either: the same scan looks in every
captured record of that level for every content the tests sent (``say``, ``Memory.add``
and ``register_content`` register it) or that Redis still stores in a session's log.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import openai
import pytest

from devsupport.cluster import RedisCluster
from devsupport.fake_anthropic import FakeAnthropic
from devsupport.fake_upstream import FakeUpstream
from devsupport.gateways import build_settings, start_gateway
from devsupport.servers import RedisProcess, ServerThread, running_redis
from gateway.config import RedisConfig
from gateway.store.redis_store import RedisStore, create_client
from tests.support.clients import (
    SENT_CONTENTS,
    Memory,
    close_clients,
)
from tests.support.round_trips import RoundTrips, counted_gateways

USED_KEYS: list[str] = []
# Shorter contents ("ok", "hi") could turn up in a log line by chance.
MIN_CONTENT_CHARS = 12


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []
        self.records: list[tuple[int, str]] = []  # (level, formatted record)
        # Records already checked: a key or a content is registered before it is used, so
        # a record can only repeat those registered by the time it was checked. Checking
        # only the new records keeps each check's cost flat (it was ~3 s, and growing,
        # for every module that switches between one Redis and a cluster).
        self.checked = 0

    def unchecked(self) -> tuple[list[str], list[tuple[int, str]]]:
        """The records since the last call."""
        start, self.checked = self.checked, len(self.lines)
        return self.lines[start:], self.records[start:]

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record)
        self.lines.append(line)
        self.records.append((record.levelno, line))


PIECE = 8  # the shortest piece of a key the scan looks for


def secret_pieces(key: str) -> set[str]:
    return {key[i : i + PIECE] for i in range(len(key) - PIECE + 1)}


def find_secrets(blobs: list[bytes | str], keys: list[str]) -> list[str]:
    """Every piece of a key (``PIECE`` characters) that a blob holds.

    A blob's text is cut into runs of the characters keys are made of (by a regex, in C),
    and only the windows of runs long enough are looked up: the cost is the text's
    length, not its length times the thousands of pieces the suite's keys make."""
    pieces = set().union(*(secret_pieces(k) for k in keys)) if keys else set()
    if not pieces:
        return []
    alphabet = "".join(sorted(set("".join(keys))))
    runs = re.compile(f"[{re.escape(alphabet)}]{{{PIECE},}}")
    found = []
    for blob in blobs:
        text = blob.decode("utf-8", "replace") if isinstance(blob, bytes) else blob
        for run in runs.findall(text):
            found += [w for i in range(len(run) - PIECE + 1) if (w := run[i : i + PIECE]) in pieces]
    return found


def find_logged_contents(records: list[tuple[int, str]], contents: set[str]) -> list[str]:
    """Contents (of at least ``MIN_CONTENT_CHARS``) that a record at INFO or above holds.

    Contents are looked up by their first ``MIN_CONTENT_CHARS`` characters in each window
    of a record (the cost is the records' length), then compared whole."""
    by_start: dict[str, list[str]] = {}
    for content in {c.strip() for c in contents}:
        if len(content) >= MIN_CONTENT_CHARS:
            by_start.setdefault(content[:MIN_CONTENT_CHARS], []).append(content)
    found = []
    for level, line in records:
        if level < logging.INFO:
            continue
        for i in range(len(line) - MIN_CONTENT_CHARS + 1):
            for content in by_start.get(line[i : i + MIN_CONTENT_CHARS], ()):
                if line.startswith(content, i):
                    found.append(content)
    return found


def stored_contents(client: Any) -> set[str]:
    """The text of every message Redis holds in a session's log."""
    found: set[str] = set()
    for key in client.scan_iter(match="mg:*:log", count=1000):
        for raw in client.lrange(key, 0, -1):
            content = json.loads(raw).get("content")
            parts = content if isinstance(content, list) else [content]
            for part in parts:
                text = part.get("text") if isinstance(part, dict) else part
                if isinstance(text, str):
                    found.add(text)
    return found


def redis_dump(client: Any) -> list[bytes]:
    blobs: list[bytes] = []
    for key in client.scan_iter(count=1000):
        blobs.append(key)
        kind = client.type(key)
        if kind == b"string":
            blobs.append(client.get(key))
        elif kind == b"list":
            blobs += client.lrange(key, 0, -1)
        elif kind == b"hash":
            for field, value in client.hgetall(key).items():
                blobs += [field, value]
        elif kind == b"set":
            blobs += list(client.smembers(key))
        elif kind == b"zset":
            blobs += [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == b"stream":
            for _, fields in client.xrange(key):
                for field, value in fields.items():
                    blobs += [field, value]
    return blobs


@pytest.fixture(scope="session")
def log_capture() -> Iterator[_Capture]:
    handler = _Capture()
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield handler
    root.removeHandler(handler)
    root.setLevel(previous)


@pytest.fixture(scope="session")
def redis_server(log_capture: _Capture) -> Iterator[RedisProcess]:
    server = RedisProcess().start()
    yield server
    try:
        client = server.client()
        lines, records = log_capture.unchecked()
        leaks = find_secrets(redis_dump(client), USED_KEYS)
        leaks += find_secrets(lines, USED_KEYS)
        logged = find_logged_contents(records, SENT_CONTENTS | stored_contents(client))
        client.close()
        assert not leaks, f"bearer key material found in Redis or logs: {sorted(set(leaks))[:5]}"
        assert not logged, f"message content logged at INFO or above: {sorted(set(logged))[:5]}"
    finally:
        server.cleanup()


class ClusterRedis:
    """A local Redis Cluster in the place of ``redis_server``: ``url`` in the gateway's
    ``redis+cluster://`` form, ``client()`` a cluster client."""

    def __init__(self, cluster: RedisCluster) -> None:
        self.cluster = cluster

    @property
    def url(self) -> str:
        return "redis+cluster://" + self.cluster.url.split("://", 1)[1]

    def client(self) -> Any:
        return self.cluster.client()


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisProcess]:
    """A Redis of the test module's own, not the suite's: for tests that flush it, or
    whose workers would take (and run) the jobs other tests left in the shared one."""
    with running_redis() as server:
        yield server


@pytest.fixture
def admin(private_redis: RedisProcess) -> Iterator[Any]:
    """A client of the module's own Redis, flushed before each test."""
    client = private_redis.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture(scope="session")
def on_cluster(log_capture: _Capture) -> Iterator[ClusterRedis]:
    """A 3-master cluster for the modules whose tests run on both (see test_concurrency's
    ``redis_server``), checked for key material at the end as ``redis_server`` is. One for
    the session, as the suite's single Redis is: the same tests share that one already,
    and a cluster takes seconds to form."""
    with RedisCluster() as cluster:
        backend = ClusterRedis(cluster)
        yield backend
        client = backend.client()
        leaks = find_secrets(redis_dump(client), USED_KEYS)
        client.close()
        assert not leaks, f"bearer key material found in the cluster: {sorted(set(leaks))[:5]}"


def on_one_redis_and_a_cluster() -> Any:
    """A module's ``redis_server`` that runs each of its tests twice: on the suite's Redis,
    and on a 3-master Redis Cluster (``on_cluster``: gateways and stores made by these
    fixtures reach it as ``redis+cluster://``). Assign it: ``redis_server = …()``."""

    @pytest.fixture(scope="module", params=["one redis", "cluster"])
    def redis_server(request: pytest.FixtureRequest, redis_server: RedisProcess) -> Any:
        if request.param == "cluster":
            return request.getfixturevalue("on_cluster")
        return redis_server

    return redis_server


@pytest.fixture(scope="session")
def fake_upstream_server() -> Iterator[tuple[FakeUpstream, ServerThread]]:
    fake = FakeUpstream()
    with ServerThread(fake.app()) as thread:
        yield fake, thread


@pytest.fixture
def fake_upstream(fake_upstream_server: tuple[FakeUpstream, ServerThread]) -> FakeUpstream:
    fake, _ = fake_upstream_server
    fake.requests.clear()
    fake.disconnects.clear()
    fake.anthropic = FakeAnthropic()  # its prompt cache, and a test's cache settings
    return fake


@pytest.fixture
def upstream_url(fake_upstream_server: tuple[FakeUpstream, ServerThread]) -> str:
    return fake_upstream_server[1].url + "/v1"


GatewayFactory = Callable[..., ServerThread]

# How long a test gateway's turn waits for Redis before it (rightly) degrades. Redis's
# default, 100 ms, measures the scheduler here, not Redis: the gateway runs in the test's
# process, beside its clients (the SDKs, Playwright) and coverage's tracer, on a loaded
# 2-core machine; a turn that degraded there is neither recorded nor receipted, and the
# test fails on what it was not testing. The tests of the deadline set their own
# (tests/system/test_redis_faults.py); how fast a turn is, the benchmarks measure.
REDIS_DEADLINE_MS = 3000


@pytest.fixture
def make_gateway(upstream_url: str, redis_server: RedisProcess) -> Iterator[GatewayFactory]:
    started: list[ServerThread] = []

    def make(
        redis_url: str | None = None, clock: Callable[[], float] = time.time, **overrides: Any
    ) -> ServerThread:
        redis = {"timeout_ms": REDIS_DEADLINE_MS, **overrides.get("redis", {})}
        overrides = {**overrides, "redis": redis}
        settings = build_settings(upstream_url, redis_url or redis_server.url, **overrides)
        thread = start_gateway(settings, clock)
        started.append(thread)
        return thread

    yield make
    for thread in started:
        thread.stop()


@pytest.fixture
def gateway(make_gateway: GatewayFactory) -> ServerThread:
    return make_gateway()


@pytest.fixture
def counted_gateway(
    upstream_url: str, redis_server: RedisProcess
) -> Iterator[tuple[Any, RoundTrips]]:
    """Gateways whose store counts its round trips at its link (``make(preset)``)."""
    with counted_gateways(upstream_url, redis_server) as made:
        yield made


@pytest.fixture
def api_key() -> str:
    key = "sk-test-" + secrets.token_urlsafe(24)
    USED_KEYS.append(key)
    return key


@pytest.fixture
def session_id() -> str:
    return f"sess-{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Clients a test opened are closed even when it fails (no leaked sockets)."""
    yield
    close_clients()


@pytest.fixture
def memory_for(api_key: str, session_id: str) -> Callable[[ServerThread], Memory]:
    """The memory API of this test's session on a given gateway."""
    return lambda gateway: Memory(gateway, api_key, session_id)


@pytest.fixture
async def async_openai(
    gateway: ServerThread, api_key: str, session_id: str
) -> AsyncIterator[openai.AsyncOpenAI]:
    """The async OpenAI SDK on this test's gateway (its module's, if it has its own) and
    session, without retries: what failed shows (the Agents SDK runs on it)."""
    opened = openai.AsyncOpenAI(
        base_url=gateway.url + "/v1",
        api_key=api_key,
        default_headers={"X-Session-Id": session_id},
        max_retries=0,
    )
    yield opened
    await opened.close()


@pytest.fixture
async def store(redis_server: RedisProcess) -> AsyncIterator[RedisStore]:
    """A RedisStore on the suite's Redis, for tests that drive the store or worker directly."""
    where = RedisConfig(url=redis_server.url)  # a cluster's url says so (on_cluster)
    opened = RedisStore(
        create_client(where.url, timeout_s=2, max_connections=4, cluster=where.cluster),
        timeout_s=2,
        retention_s=3600,
    )
    yield opened
    await opened.close()  # the pool too: a socket left to the GC warns in a later test
