"""A session's stored log, read straight from Redis through the key schema."""

from __future__ import annotations

import json
from typing import Any

from devsupport.servers import RedisProcess
from gateway.auth.identity import tenant_id
from gateway.store.keys import TENANT_SECRET_KEY, SessionKeys


def stored_log(redis_server: RedisProcess, key: str, session: str) -> list[dict]:
    client = redis_server.client()
    try:
        return log_of(client, key, session)
    finally:
        client.close()


def log_of(client: Any, key: str, session: str) -> list[dict]:
    """A session's stored messages, read with ``client`` (a Redis or a cluster client)."""
    secret = client.get(TENANT_SECRET_KEY)
    assert secret is not None
    keys = SessionKeys(tenant_id(secret, key), session)
    return [json.loads(raw) for raw in client.lrange(keys.log, 0, -1)]


def roles_and_text(log: list[dict]) -> list[tuple[str, str | None]]:
    return [(m["role"], m["content"]) for m in log]
