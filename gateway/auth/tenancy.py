"""The secret behind tenant ids: from the config, or kept in Redis by every process.

Replicas must agree on it, or the same key would name different tenants on different
processes. With ``server.tenant_secret`` set, the config is the secret and nothing else
is. Without it, the first process creates one in Redis (``SET NX`` at
``mg:tenant-secret``) and every process reads it from there.

A secret kept only in Redis is lost with Redis's data (a restart without persistence, a
flush, a failover to an empty replica, an evicting ``allkeys-*`` policy). A process
started then would make a new one, and every key would name two tenants: one on the old
processes, one on the new, each erasing and serving its own. So every process that holds
the secret keeps it there (``keep``, every ``auth.refresh_s``, run by ``keep_secret``):
``SET NX`` of its own secret and ``GET`` in one round trip. After a loss the first old
process to poll writes the secret back, and processes started after that read it. Only a
process that starts in that moment (at most ``auth.refresh_s`` after the loss, or longer
if every old process is cut off from Redis) can still make a new one; then the old
processes find it in Redis, log an ERROR naming the fix (set ``server.tenant_secret``),
count it (``memory_gateway_tenant_secret_replaced_total``) and adopt it, so that every
process names every key alike again within ``auth.refresh_s``: memory written under the
losing secret is unreachable until its TTL. The secret is never memoized anywhere else:
tenant ids are computed from it per request (``tenant_for``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from gateway.auth.identity import tenant_id
from gateway.auth.periodic import every
from gateway.observability import metrics

log = logging.getLogger(__name__)


class SecretStore(Protocol):
    """Where the shared secret is kept (the store; a Protocol, so that ``auth`` and the
    store's gateway keys, which ``auth`` reads, do not import each other)."""

    async def tenant_secret(
        self, timeout_s: float | None = None, *, keep: bytes | None = None
    ) -> bytes: ...


class Tenants:
    def __init__(self, store: SecretStore, configured_secret: str | None) -> None:
        self.store = store
        self.configured = bool(configured_secret)  # ("": none, as null)
        self._secret = configured_secret.encode() if configured_secret else None

    async def load(self, timeout_s: float | None = None) -> None:
        """Fetch the shared secret now (start-up); raises ``StoreUnavailable``."""
        if self._secret is None:
            self._secret = await self.store.tenant_secret(timeout_s)

    async def keep(self, via: SecretStore | None = None, timeout_s: float | None = None) -> None:
        """Write this process's secret back where Redis lost it, and adopt Redis's where
        another process made a new one meanwhile; raises ``StoreUnavailable``. ``via``:
        the store to ask (the background's connections; default: the request path's)."""
        if self.configured:
            return
        store = via or self.store
        held = self._secret
        found = await store.tenant_secret(timeout_s, keep=held)
        if held is None:  # not read yet (Redis was away at start-up): now it is
            self._secret = found
            return
        if found != held:
            log.error(
                "the tenant secret in Redis (mg:tenant-secret) is not the one this process "
                "used: Redis lost it and another gateway made a new one before this one "
                "wrote it back. This process now uses Redis's, and every key names the "
                "tenant it names on the others again; memory written under the old secret "
                "is unreachable until its TTL. Fix: set server.tenant_secret (the same "
                "long random string on every process) so that tenant ids do not depend on "
                "Redis keeping its data."
            )
            metrics.tenant_secret_replaced()
            self._secret = found

    async def tenant_for(self, name: str) -> str:
        """The tenant id of a client key (forward mode) or of a gateway key's tenant."""
        await self.load()
        assert self._secret is not None
        return tenant_id(self._secret, name)

    def keyed(self, value: str) -> str:
        """A keyed hash of any value (a user id on a log line): not reversible by guessing
        without the secret. Only once the secret is loaded (after ``tenant_for``)."""
        assert self._secret is not None
        return tenant_id(self._secret, "\x00" + value)[:16]


async def keep_secret(
    tenants: Tenants, via: SecretStore, every_s: float, stop: asyncio.Event
) -> None:
    """Run ``tenants.keep(via)`` every ``every_s`` until ``stop``. A failed call (Redis
    away: the secret held is still the one) is logged once and tried again at the next
    turn."""
    await every(every_s, lambda: tenants.keep(via), stop, "tenant secret not checked in Redis")
