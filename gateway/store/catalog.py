"""What an operator browses: the tenants, each tenant's sessions, a session's receipts.

Written on the turn's own round trip (``write_turn``, commands after the record script),
read only by the memory API's list and the inspector. The indexes are sorted sets scored
by last activity, sharded (``keys.INDEX_SHARDS``) so that on a cluster the writes spread
over the masters; a list reads every shard in one pipeline and merges.

Nothing is deleted when a session expires: an entry older than the retention is a
session Redis has forgotten, so reads skip it and trim it. An erased session is removed
from its shard by the erase itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.store.calls import StoreCalls, pairs, scored
from gateway.store.keys import SessionKeys, TenantKeys, all_tenants_indexes
from gateway.store.link import Command

# A search reads each shard's ids with ZSCAN MATCH; it stops once this many matched.
SEARCH_MATCHES = 1000
# The keys whose MEMORY USAGE adds up to a session's size.
_SIZED = ("meta", "log", "vec", "tiers", "pins", "jobs", "index", "vectors", "receipts")


# A session's entries in the indexes are refreshed by its turns at most this often: the
# index shards are other slots than the session's (on a cluster, other masters), and a
# write to them on every turn cost 10% more Redis CPU per turn there. A list is ordered by
# the sessions' own last activity (their meta), exact; which sessions make a list's
# newest ``limit`` may be this much out of date.
REFRESH_S = 300.0


@dataclass(frozen=True, slots=True)
class StoredReceipt:
    """A turn's receipt as JSON, and how many of the session's newest receipts to keep."""

    data: bytes
    kept: int


def write_turn(
    keys: SessionKeys,
    *,
    now: float,
    retention_s: int,
    receipt: StoredReceipt | None,
    listed: bool,
) -> list[Command]:
    """Commands sent with the record's: the session and its tenant ``listed`` as active
    now (idempotent; see ``REFRESH_S``), and this turn's receipt kept. Receipts are a
    list, not a sorted set: a receipt is longer than a sorted set's compact encoding
    allows (64 bytes), and the list's is several times smaller. Sent twice (after a
    script cache flush, see ``StoreCalls.execute``) a receipt would show twice: readers
    drop repeats."""
    commands: list[Command] = []
    if receipt is not None:
        commands.append(("LPUSH", keys.receipts, receipt.data))
        commands.append(("LTRIM", keys.receipts, 0, receipt.kept - 1))
        commands.append(("EXPIRE", keys.receipts, retention_s))
    if not listed:
        return commands
    for index, member in ((keys.listed_in, keys.session_id), (keys.tenant_listed_in, keys.tenant)):
        commands.append(("ZADD", index, repr(now), member))
        # An entry is at most REFRESH_S older than its session: the index outlives it.
        commands.append(("EXPIRE", index, retention_s + int(REFRESH_S)))
    return commands


def forget_session(keys: SessionKeys) -> Command:
    return ("ZREM", keys.listed_in, keys.session_id)


@dataclass(frozen=True, slots=True)
class ListedSession:
    session_id: str
    user_id: str | None
    message_count: int
    turns: int
    created: float | None
    updated: float
    ended: bool
    bytes: int | None  # None where MEMORY USAGE is refused (some managed Redis)

    def to_data(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "user_id": self.user_id,
            "message_count": self.message_count,
            "turns": self.turns,
            "created": self.created,
            "updated": self.updated,
            "ended": self.ended,
            "bytes": self.bytes,
        }


def _newest(found: Iterable[tuple[Any, float]], limit: int) -> list[tuple[str, float]]:
    """Merge shards: each member once, at its newest score, newest first."""
    best: dict[str, float] = {}
    for member, score in found:
        name = member.decode() if isinstance(member, bytes) else member
        best[name] = max(score, best.get(name, score))
    return sorted(best.items(), key=lambda item: (-item[1], item[0]))[:limit]


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class Catalog:
    """The operator's lists: tenants, a tenant's sessions, a session's receipts."""

    def __init__(self, calls: StoreCalls) -> None:
        self._calls = calls

    async def tenants(self, *, now: float, limit: int = 100) -> list[tuple[str, float]]:
        """Tenant ids with their last activity, newest first."""
        return _newest(await self._newest_of(all_tenants_indexes(), now, limit), limit)

    async def sessions(
        self, tenant: str, *, now: float, search: str | None = None, limit: int = 50
    ) -> list[ListedSession]:
        """The tenant's sessions, newest activity first; ``search``: a part of the id."""
        shards = TenantKeys(tenant).all_sessions()
        if search:
            found = await self._search(shards, search, now)
        else:
            found = await self._newest_of(shards, now, limit)
        chosen = _newest(found, limit)
        return await self._describe(tenant, chosen)

    async def _newest_of(
        self, indexes: tuple[str, ...], now: float, limit: int
    ) -> list[tuple[Any, float]]:
        live_since = now - self._calls.retention_s - REFRESH_S  # see REFRESH_S

        commands: list[Command] = []
        for key in indexes:
            commands.append(("ZREMRANGEBYSCORE", key, "-inf", f"({live_since!r}"))
            commands.append(
                ("ZREVRANGEBYSCORE", key, "+inf", repr(live_since), "WITHSCORES", "LIMIT", 0, limit)
            )
        replies = await self._calls.execute(commands, op="catalog_list")
        return [item for reply in replies[1::2] for item in scored(reply)]

    async def _search(
        self, shards: tuple[str, ...], search: str, now: float
    ) -> list[tuple[Any, float]]:
        live_since = now - self._calls.retention_s - REFRESH_S  # see REFRESH_S
        pattern = f"*{_glob_escape(search)}*"
        found: list[tuple[Any, float]] = []
        for key in shards:
            cursor: Any = 0
            while True:
                command = ("ZSCAN", key, cursor, "MATCH", pattern, "COUNT", 500)
                ((cursor, page),) = await self._calls.execute([command], op="catalog_search")
                for member, score in scored(page):
                    if score >= live_since:
                        found.append((member, score))
                    if len(found) >= SEARCH_MATCHES:
                        return found
                if int(cursor) == 0:
                    break
        return found

    async def _describe(self, tenant: str, chosen: list[tuple[str, float]]) -> list[ListedSession]:
        sessions = [SessionKeys(tenant, sid) for sid, _ in chosen]

        commands: list[Command] = []
        for keys in sessions:
            commands += [("HGETALL", keys.meta), ("LLEN", keys.log)]
        replies = await self._calls.execute(commands, op="catalog_describe") if commands else []
        sizes = await self._sizes(sessions)
        listed, gone = [], []
        for i, (keys, (_, updated)) in enumerate(zip(sessions, chosen, strict=True)):
            raw_meta, count = replies[2 * i], replies[2 * i + 1]
            meta = {k.decode(): v.decode() for k, v in pairs(raw_meta).items()}
            if not meta:  # expired or erased since it was listed
                gone.append(keys)
                continue
            listed.append(
                ListedSession(
                    session_id=keys.session_id,
                    user_id=meta.get("user_id") or None,
                    message_count=int(count),
                    turns=int(meta.get("turns", 0)),
                    created=float(meta["created"]) if "created" in meta else None,
                    updated=float(meta.get("updated", updated)),
                    ended="ended" in meta,
                    bytes=sizes[i],
                )
            )
        listed.sort(key=lambda session: (-session.updated, session.session_id))
        if gone:
            await self._calls.execute([forget_session(keys) for keys in gone], op="catalog_trim")
        return listed

    async def _sizes(self, sessions: list[SessionKeys]) -> list[int | None]:
        """Each session's bytes in Redis (MEMORY USAGE of its keys, Redis's estimate)."""

        commands = [
            ("MEMORY", "USAGE", getattr(keys, name)) for keys in sessions for name in _SIZED
        ]
        # An error reply (MEMORY refused) is returned in its place: that size is unknown.
        replies = (
            await self._calls.execute(commands, op="catalog_sizes", needed=0) if commands else []
        )
        sizes: list[int | None] = []
        for i in range(len(sessions)):
            parts = replies[i * len(_SIZED) : (i + 1) * len(_SIZED)]
            refused = any(isinstance(part, Exception) for part in parts)  # an error reply
            sizes.append(None if refused else sum(int(part or 0) for part in parts))
        return sizes

    async def receipts(self, keys: SessionKeys) -> list[dict[str, Any]]:
        """The session's recent receipts, newest first."""
        (raw,) = await self._calls.execute([("LRANGE", keys.receipts, 0, -1)], op="receipts")
        return [json.loads(item) for item in dict.fromkeys(raw)]  # a repeat: one receipt
