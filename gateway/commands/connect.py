"""``check-config FILE --connect``: can this configuration reach what it names?

Validation alone passes a config whose Redis is down or whose upstream is a typo; the
operator then learns it from the first request. Each check prints one line and the
command exits 1 when any fails. An upstream "reachable" is any HTTP answer to
``GET {base_url}/models``: a model server without that path still answers 404, and a
refused key (401/403) is reported as such: a failure only when a key is configured
(without one, clients bring their own and the upstream rightly refuses none).

With an external Redis and no ``server.tenant_secret``, a last line says whether that
Redis keeps the tenant secret across a restart (a WARNING, not a failure, when it may
not: see ``store/durability.tenant_secret_warning``).
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

import httpx
from redis.asyncio import RedisCluster

from gateway.config import Settings
from gateway.store.durability import read_settings, tenant_secret_warning
from gateway.store.redis_store import RedisStore, create_client

TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    warning: bool = False  # ok, but the operator should read why (the exit code is 0)

    def line(self) -> str:
        verdict = "FAILED" if not self.ok else "WARNING" if self.warning else "OK"
        return f"{self.name}: {verdict} ({self.detail})"


def without_password(url: str) -> str:
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


async def _ping(url: str, cluster: bool) -> float:
    client = create_client(url, timeout_s=TIMEOUT_S, max_connections=1, cluster=cluster)
    try:
        started = time.perf_counter()
        await asyncio.wait_for(client.ping(), TIMEOUT_S)
        return time.perf_counter() - started
    finally:
        await client.aclose()
        if not isinstance(client, RedisCluster):
            # A pool passed in explicitly is not closed by the client: close its sockets too.
            await client.connection_pool.disconnect()


def check_redis(settings: Settings) -> Check:
    url = settings.redis.url
    if url == "embedded":
        return Check("redis embedded", True, "started by the gateway itself; nothing to reach")
    name = f"redis {without_password(url)}"
    try:
        elapsed = asyncio.run(_ping(url, settings.redis.cluster))
    except Exception as error:  # any failure to PING is the answer this check gives
        return Check(name, False, f"{type(error).__name__}: {error}")
    return Check(name, True, f"PING answered in {elapsed * 1000:.1f} ms")


async def _redis_settings(url: str, cluster: bool) -> dict[str, str]:
    client = create_client(url, timeout_s=TIMEOUT_S, max_connections=2, cluster=cluster)
    store = RedisStore(client, timeout_s=TIMEOUT_S, retention_s=1)
    try:
        return await read_settings(store.server, TIMEOUT_S)
    finally:
        await store.close()


def check_tenant_secret(settings: Settings) -> Check | None:
    """Whether the tenant secret, kept in Redis when ``server.tenant_secret`` is not set,
    survives a Redis restart; None when there is nothing to say (a configured secret, or
    the embedded Redis, which keeps an AOF)."""
    if settings.server.tenant_secret is not None or settings.redis.url == "embedded":
        return None
    name = "tenant secret"
    unknown = (
        "kept in Redis (mg:tenant-secret), whose persistence is unknown ({}): unless it "
        "persists, set server.tenant_secret"
    )
    try:
        found = asyncio.run(_redis_settings(settings.redis.url, settings.redis.cluster))
    except Exception as error:  # PING answered, CONFIG and INFO did not: no failure
        return Check(name, True, unknown.format(type(error).__name__), warning=True)
    warning = tenant_secret_warning(found)
    if warning is not None:
        return Check(name, True, warning, warning=True)
    if "appendonly" not in found:
        return Check(name, True, unknown.format("CONFIG and INFO do not say"), warning=True)
    return Check(name, True, "kept in Redis (mg:tenant-secret), which persists it")


def check_http(label: str, base_url: str, api_key: str | None) -> Check:
    name = f"{label} {base_url}"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(base_url.rstrip("/") + "/models", headers=headers, timeout=TIMEOUT_S)
    except httpx.HTTPError as error:
        return Check(name, False, f"not reachable: {type(error).__name__}: {error}")
    status = response.status_code
    if status in (401, 403):
        if api_key:
            return Check(name, False, f"reachable, key refused (GET /models: {status})")
        return Check(name, True, f"reachable; no key configured (GET /models: {status})")
    return Check(name, True, f"reachable (GET /models: {status})")


def connection_checks(settings: Settings) -> list[Check]:
    upstream = settings.upstream
    redis = check_redis(settings)
    checks = [redis, check_http("upstream", upstream.base_url, upstream.api_key)]
    summarizer = settings.summarizer
    # The summarizer's own endpoint or key, when it has one: it fails on its own.
    if summarizer.base_url not in (None, upstream.base_url) or summarizer.api_key:
        checks.append(
            check_http(
                "summarizer",
                summarizer.base_url or upstream.base_url,
                summarizer.api_key or upstream.api_key,
            )
        )
    secret = check_tenant_secret(settings) if redis.ok else None
    if secret is not None:
        checks.append(secret)
    return checks
