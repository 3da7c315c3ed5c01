"""Start-up check: would this Redis silently drop memory?

Two settings lose memory without any error reaching the gateway: an eviction policy
other than ``noeviction`` (a full Redis deletes keys; every memory key carries a TTL, so
the ``volatile-*`` policies evict it as readily as ``allkeys-*``), and no persistence at
all (a Redis restart erases everything). The check only warns: the operator may know
better (a cache-only deployment), and start-up never waits on a Redis that is down.

``durability_warnings`` decides from the settings alone (pure); ``check_durability``
reads them with ``CONFIG GET``, or from ``INFO`` where CONFIG is disabled, as managed
Redis services often do.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gateway.store.calls import StoreUnavailable
from gateway.store.redis_server import RedisServer

log = logging.getLogger(__name__)

# What CONFIG GET is asked for; INFO gives the first two under other names, never "save".
SETTINGS = ("maxmemory-policy", "appendonly", "save")


def settings_from_info(info: Mapping[str, Any]) -> dict[str, str]:
    """The settings INFO reveals (``save`` is not among them)."""
    out: dict[str, str] = {}
    if "maxmemory_policy" in info:
        out["maxmemory-policy"] = str(info["maxmemory_policy"])
    if "aof_enabled" in info:
        out["appendonly"] = "yes" if str(info["aof_enabled"]) == "1" else "no"
    return out


def durability_warnings(settings: Mapping[str, str]) -> list[str]:
    """A warning per setting that would drop memory silently; a missing setting is unknown."""
    warnings = []
    policy = settings.get("maxmemory-policy")
    if policy is not None and policy != "noeviction":
        warnings.append(
            f"redis maxmemory-policy is {policy}: a full Redis deletes keys and session "
            "memory vanishes without an error (memory keys have a TTL, so volatile-* "
            "policies evict them too). Fix: maxmemory-policy noeviction in redis.conf "
            "(or CONFIG SET maxmemory-policy noeviction); a full Redis then refuses "
            "writes and the gateway reports X-Memory-Status: degraded."
        )
    aof_off = settings.get("appendonly") == "no"
    if aof_off and settings.get("save") == "":
        warnings.append(
            'redis has no persistence (appendonly no, save ""): a Redis restart erases '
            "all memory. Fix: appendonly yes with appendfsync everysec in redis.conf (or "
            "CONFIG SET appendonly yes)."
        )
    elif aof_off and "save" not in settings:
        warnings.append(
            "redis has appendonly no and its RDB snapshot schedule cannot be read (CONFIG "
            "is disabled): unless the service snapshots it, a Redis restart erases all "
            "memory. Fix: enable AOF (appendonly yes), or confirm the service's snapshots."
        )
    return warnings


def tenant_secret_warning(settings: Mapping[str, str]) -> str | None:
    """The warning for a tenant secret kept only in a Redis without persistence (when
    ``server.tenant_secret`` is not set); None when Redis persists it, or may."""
    if settings.get("appendonly") != "no" or settings.get("save", "") != "":
        return None
    return (
        "server.tenant_secret is not set and redis may have no persistence: the secret "
        "that tenant ids are made from lives only in Redis (mg:tenant-secret). Running "
        "gateways write it back after Redis loses it, but a gateway started before they "
        "do makes a new one, and the tenant ids of every key change (memory written in "
        "between becomes unreachable and unerasable until its TTL). Fix: set "
        "server.tenant_secret (the same long random string on every process), or give "
        "Redis persistence."
    )


async def read_settings(store: RedisServer, timeout_s: float) -> dict[str, str]:
    """The settings ``durability_warnings`` judges, by CONFIG GET or else from INFO;
    raises ``StoreUnavailable`` if Redis cannot be read."""
    settings = await store.server_config(SETTINGS, timeout_s)
    if settings is None:
        settings = settings_from_info(await store.server_info(timeout_s))
    return settings


async def check_durability(
    store: RedisServer, timeout_s: float, *, secret_in_redis: bool = False
) -> list[str]:
    """The warnings for the store's Redis; raises ``StoreUnavailable`` if it cannot tell.
    ``secret_in_redis``: the tenant secret is Redis's (``server.tenant_secret`` unset)."""
    settings = await read_settings(store, timeout_s)
    warnings = durability_warnings(settings)
    secret = tenant_secret_warning(settings) if secret_in_redis else None
    return warnings if secret is None else [*warnings, secret]


async def warn_if_not_durable(
    store: RedisServer, timeout_s: float = 2.0, *, secret_in_redis: bool = False
) -> None:
    """Log each warning; never raise (the gateway serves without memory if it must)."""
    try:
        warnings = await check_durability(store, timeout_s, secret_in_redis=secret_in_redis)
    except StoreUnavailable as error:
        log.warning("could not check redis persistence and eviction settings: %s", error)
        return
    for warning in warnings:
        log.warning("%s", warning)
    if not warnings:
        log.info("redis eviction and persistence settings keep memory")
