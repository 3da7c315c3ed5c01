"""The Redis server itself: is it there (PING), how is it configured (CONFIG, INFO: what
``durability`` judges), and the tenant secret every replica shares."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError

from gateway.store.calls import StoreCalls, StoreUnavailable
from gateway.store.keys import TENANT_SECRET_KEY


class RedisServer:
    """Server introspection and the tenant secret."""

    def __init__(self, calls: StoreCalls) -> None:
        self._calls = calls

    async def ping(self, timeout_s: float | None = None) -> None:
        await self._calls.execute([("PING",)], op="ping", timeout_s=timeout_s)

    async def server_config(
        self, names: Sequence[str], timeout_s: float | None = None
    ) -> dict[str, str] | None:
        """``CONFIG GET`` of each name; None where CONFIG is disabled (managed Redis)."""

        async def read() -> dict[str, str] | None:
            found: dict[str, str] = {}
            try:
                for name in names:  # one name per call: Redis < 7 takes only one
                    reply = await self._calls.client.config_get(name)
                    found.update({str(k): str(v) for k, v in reply.items()})
            except ResponseError:  # renamed, or denied by an ACL
                return None
            return found

        return await self._calls.bounded(read, op="server_config", timeout_s=timeout_s)

    async def server_info(self, timeout_s: float | None = None) -> dict[str, Any]:
        """``INFO`` (every section): what a Redis that refuses CONFIG still tells."""
        return dict(
            await self._calls.bounded(self._calls.client.info, op="info", timeout_s=timeout_s)
        )

    async def tenant_secret(
        self, timeout_s: float | None = None, *, keep: bytes | None = None
    ) -> bytes:
        """The key of the tenant hash, shared by every replica: Redis's, or ``keep`` (a
        new random one when None) written where Redis has none, in one round trip."""
        proposed = keep if keep is not None else secrets.token_hex(32).encode()
        commands = [
            ("SET", TENANT_SECRET_KEY, proposed, "NX"),
            ("GET", TENANT_SECRET_KEY),
        ]
        _, value = await self._calls.execute(commands, op="tenant_secret", timeout_s=timeout_s)
        if value is None:
            raise StoreUnavailable("tenant secret vanished")
        return value.encode() if isinstance(value, str) else bytes(value)
