"""The secret behind tenant ids: from the config, or created once in Redis.

Replicas must agree on it, or the same key would name different tenants on different
processes; keeping it in Redis (``SET NX``) makes that automatic. It is fetched once and
cached: it never changes while the data it names exists.
"""

from __future__ import annotations

from typing import Protocol

from gateway.auth.identity import tenant_id


class SecretStore(Protocol):
    """Where the shared secret is kept (the store; a Protocol, so that ``auth`` and the
    store's gateway keys, which ``auth`` reads, do not import each other)."""

    async def tenant_secret(self, timeout_s: float | None = None) -> bytes: ...


class Tenants:
    def __init__(self, store: SecretStore, configured_secret: str | None) -> None:
        self.store = store
        self._secret = configured_secret.encode() if configured_secret else None

    async def load(self, timeout_s: float | None = None) -> None:
        """Fetch the shared secret now (start-up); raises ``StoreUnavailable``."""
        if self._secret is None:
            self._secret = await self.store.tenant_secret(timeout_s)

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
