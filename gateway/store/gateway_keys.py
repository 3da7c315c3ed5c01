"""The gateway keys made through the admin API, in Redis (hashes and records only)."""

from __future__ import annotations

import json
from typing import Any

from gateway.auth import KeyRecord
from gateway.store.keys import AUTH_KEYS, AUTH_VERSION
from gateway.store.redis_store import RedisStore

# KEYS: keys, version.  ARGV: key id, record JSON ("" to revoke).  Changes the keys and
# moves the version in one step, so a process that sees the new version reads the change.
_CHANGE_SCRIPT = """
local changed
if ARGV[2] == '' then
  changed = redis.call('HDEL', KEYS[1], ARGV[1])
else
  changed = redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  changed = 1
end
if changed == 1 then
  redis.call('INCR', KEYS[2])
end
return changed
"""


class GatewayKeys:
    """Create, list and revoke gateway keys; tell whether any changed since a version."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._change = store.client.register_script(_CHANGE_SCRIPT)

    async def changed_since(self, version: int | None) -> tuple[int, list[KeyRecord]] | None:
        """None when the keys are as at ``version``; else the version and every record."""
        client: Any = self.store.client
        current = int(await self.store.bounded(lambda: client.get(AUTH_VERSION)) or 0)
        if current == version:
            return None
        raw: Any = await self.store.bounded(lambda: client.hgetall(AUTH_KEYS))
        records = [KeyRecord.from_data(json.loads(value)) for value in raw.values()]
        return current, records

    async def save(self, record: KeyRecord) -> None:
        data = json.dumps(record.to_data())
        await self.store.bounded(
            lambda: self._change(keys=[AUTH_KEYS, AUTH_VERSION], args=[record.id, data])
        )

    async def revoke(self, key_id: str) -> bool:
        revoked = await self.store.bounded(
            lambda: self._change(keys=[AUTH_KEYS, AUTH_VERSION], args=[key_id, ""])
        )
        return bool(revoked)
