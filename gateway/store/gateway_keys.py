"""The gateway keys made through the admin API, in Redis: each key's record as the JSON
object ``auth`` writes (hashes and records only, never a key), and their version."""

from __future__ import annotations

import json
import secrets
from typing import Any

from gateway.store.calls import StoreCalls, pairs
from gateway.store.keys import AUTH_KEYS, AUTH_VERSION


class GatewayKeys:
    """Create, list and revoke gateway keys; tell whether any changed since a version."""

    def __init__(self, calls: StoreCalls) -> None:
        self._calls = calls

    async def changed_since(self, version: str | None) -> tuple[str, dict[str, bytes]] | None:
        """None when the keys are as at ``version``; else the version and every record's
        JSON by key id, unparsed (the registry parses only the records that changed).
        The version is "<epoch>:<n>" ("": none, or lost with Redis's data)."""
        (raw_version,) = await self._calls.execute([("GET", AUTH_VERSION)], op="keys_version")
        current = bytes(raw_version or b"").decode("ascii", "replace")
        if current == version:
            return None
        (raw,) = await self._calls.execute([("HGETALL", AUTH_KEYS)], op="keys_read")
        records = {_text(field): value for field, value in pairs(raw).items()}
        return current, records

    async def save(self, key_id: str, data: dict[str, Any]) -> None:
        await self._change(key_id, json.dumps(data))

    async def revoke(self, key_id: str) -> bool:
        return bool(await self._change(key_id, ""))

    async def _change(self, key_id: str, data: str) -> object:
        """Changes the keys and moves their version in one step (``change_key.lua``)."""
        epoch = secrets.token_hex(8)  # used only if the version is missing
        call = self._calls.script("change_key", [AUTH_KEYS, AUTH_VERSION], [key_id, data, epoch])
        (reply,) = await self._calls.execute([call], op="keys_change")
        return reply


def _text(field: bytes | str) -> str:
    return field.decode("ascii", "replace") if isinstance(field, bytes) else field
