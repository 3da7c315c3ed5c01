"""A user's memory across sessions: the index of their sessions (all, and those active),
the history of their ended sessions, and the profile built from it.

The request path writes the index inside the record's round trip (``add_user_session``,
``ask_idle``: commands sent with the record's); the rest is the worker's and the memory
API's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.store.calls import StoreCalls
from gateway.store.keys import SessionKeys, UserKeys
from gateway.store.link import Command

# Idle sessions ended at once when a user starts a session: the rest wait for the next.
IDLE_BATCH = 32


@dataclass(frozen=True, slots=True)
class Joining:
    """A session joining its user's index with this append; with ``idle_before``, the
    user's sessions idle since then (up to ``IDLE_BATCH``) are found in the same round
    trip."""

    user: UserKeys
    idle_before: float | None = None


def add_user_session(user: UserKeys, session_id: str, retention_s: int) -> list[Command]:
    return [("SADD", user.sessions, session_id), ("EXPIRE", user.sessions, retention_s)]


def ask_idle(user: UserKeys, idle_before: float) -> Command:
    return ("ZRANGEBYSCORE", user.active, "-inf", f"({idle_before!r}", "LIMIT", 0, IDLE_BATCH)


def idle_of(reply: Any) -> tuple[str, ...]:
    """``ask_idle``'s reply: session ids, sorted."""
    return tuple(sorted(item.decode() for item in reply))


class Users:
    """The user index, history and profile."""

    def __init__(self, calls: StoreCalls) -> None:
        self._calls = calls

    async def index_user_session(self, user: UserKeys, session_id: str) -> None:
        commands = add_user_session(user, session_id, self._calls.retention_s)
        await self._calls.execute(commands, op="index_user_session")

    async def user_history(self, user: UserKeys) -> list[dict[str, Any]]:
        (raw,) = await self._calls.execute([("LRANGE", user.history, 0, -1)], op="user_history")
        return [json.loads(item) for item in raw]

    async def idle_sessions(self, user: UserKeys, *, idle_before: float, exclude: str) -> list[str]:
        """The user's sessions, still open, with no activity since ``idle_before`` (up to
        ``IDLE_BATCH`` of them)."""
        (found,) = await self._calls.execute([ask_idle(user, idle_before)], op="idle_sessions")
        return [s for s in idle_of(found) if s != exclude]

    async def save_user_history(
        self, user: UserKeys, entry: dict[str, Any], profile: dict[str, Any], keep: int
    ) -> None:
        """Append an ended session to the user's history and replace their profile."""

        commands: list[Command] = [
            ("LREM", user.history, 0, json.dumps(entry)),  # an end repeated is one entry
            ("LPUSH", user.history, json.dumps(entry)),
            ("LTRIM", user.history, 0, keep - 1),
            ("SET", user.profile, json.dumps(profile)),
            ("EXPIRE", user.history, self._calls.retention_s),
            ("EXPIRE", user.profile, self._calls.retention_s),
        ]
        await self._calls.execute(commands, op="save_user_history")

    async def leave_active(self, user: UserKeys, session_id: str) -> None:
        """An ended session leaves its user's active index (a new turn brings it back)."""
        await self._calls.execute([("ZREM", user.active, session_id)], op="leave_active")

    async def forget_user_session(self, user: UserKeys, session_id: str) -> None:
        """Drop a session from its user's index and history. The profile was merged from
        it and cannot be un-merged: it goes too, and the user's next ended session
        rebuilds it from the history that is left."""
        op = "forget_user_session"
        (raw,) = await self._calls.execute([("LRANGE", user.history, 0, -1)], op=op)
        entries = [e for e in raw if json.loads(e).get("session_id") == session_id]
        commands: list[Command] = [
            ("SREM", user.sessions, session_id),
            ("ZREM", user.active, session_id),
        ]
        commands += [("LREM", user.history, 0, entry) for entry in entries]
        if entries:
            commands.append(("DEL", user.profile))
        await self._calls.execute(commands, op=op)

    async def user_profile(self, user: UserKeys) -> dict[str, Any] | None:
        """The profile the user's last ended sessions made (None before the first end)."""
        (raw,) = await self._calls.execute([("GET", user.profile)], op="user_profile")
        return dict(json.loads(raw)) if raw else None

    async def rewrite_fact(
        self, user: UserKeys, session_id: str, old: str, new: str | None
    ) -> None:
        """A fact of an ended session, corrected (``new``) or deleted (None) in the user's
        history and profile too, which were made from it: the profile would otherwise
        bring the old wording back into the user's next sessions. (Not atomic with the
        session's tiers: an end writing the profile meanwhile may keep the old wording,
        until the next end, which reads the corrected tiers.)"""
        op = "rewrite_fact"
        history, profile = await self._calls.execute(
            [("LRANGE", user.history, 0, -1), ("GET", user.profile)], op=op
        )
        commands: list[Command] = []
        for raw in history:
            entry = json.loads(raw)
            if entry.get("session_id") != session_id or old not in entry.get("facts", ()):
                continue
            entry["facts"] = _replaced(entry["facts"], old, new)
            commands.append(("LSET", user.history, history.index(raw), json.dumps(entry)))
        if profile:
            data = json.loads(profile)
            if old in data.get("facts", ()):
                data["facts"] = _replaced(data["facts"], old, new)
                commands.append(("SET", user.profile, json.dumps(data), "KEEPTTL"))
        if commands:
            await self._calls.execute(commands, op=op)

    async def user_sessions(self, user: UserKeys) -> list[str]:
        (raw,) = await self._calls.execute([("SMEMBERS", user.sessions)], op="user_sessions")
        return sorted(item.decode() for item in raw)

    async def newest_sessions(self, user: UserKeys, sessions: list[str], limit: int) -> list[str]:
        """The ``limit`` of the user's ``sessions`` last active most recently, newest first
        (the index is a set: its order says nothing of when)."""
        if len(sessions) <= limit:
            return sessions
        commands: list[Command] = [
            ("HGET", SessionKeys(user.tenant, sid).meta, "updated") for sid in sessions
        ]
        replies = await self._calls.execute(commands, op="user_newest")
        updated = [float(raw or 0) for raw in replies]
        order = sorted(range(len(sessions)), key=lambda i: (-updated[i], sessions[i]))
        return [sessions[i] for i in order[:limit]]


def _replaced(texts: list[str], old: str, new: str | None) -> list[str]:
    if new is None:
        return [text for text in texts if text != old]
    return [new if text == old else text for text in texts]
