"""What an operator can see and do with a tenant's sessions: one implementation behind
the memory API (``routes/memory_api``) and the inspector (``ui``).

Each operation takes the session's keys, so the caller decides the tenant: the memory
API from the caller's bearer key, the inspector from the admin's choice.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gateway.errors import InvalidRequest, NotFound
from gateway.memory.assemble import window_units
from gateway.memory.branches import Branch
from gateway.memory.model import Message, Pin, SessionState
from gateway.memory.reconcile import Reconciled
from gateway.memory.session_markdown import iso_time, session_markdown
from gateway.memory.tiers.pins import score_importance
from gateway.service.memory_service import MemoryService
from gateway.service.turn import over_quota
from gateway.service.worker import JobRunner
from gateway.store.catalog import ListedSession
from gateway.store.keys import SessionKeys
from gateway.store.quota import UNBOUNDED
from gateway.store.redis_store import Ask
from gateway.store.sessions import pin_json

# Enough to show a session's window whatever the preset.
STATE_TAIL = 200
# A pin's importance when neither given nor scored from a source message.
DEFAULT_PIN_IMPORTANCE = 0.8


# Pins a session may hold: every one is read at every turn (the top few are sent).
MAX_PINS = 200


def message_view(message: Message) -> dict[str, Any]:
    """A stored message as the memory API shows it: its index, the message, and when it
    was said (ISO 8601, UTC)."""
    view = {"index": message.index, **message.to_openai()}
    if message.ts > 0:
        view["timestamp"] = iso_time(message.ts)
    return view


def branch_view(branch: Branch) -> dict[str, Any]:
    """An abandoned branch as the export shows it: marked, never part of ``messages``."""
    return {
        "abandoned": True,
        "kind": branch.kind,
        "branched_after": branch.kept,
        "timestamp": iso_time(branch.at),
        "messages": [message_view(m) for m in branch.messages],
    }


class SessionOperations:
    def __init__(
        self, memory: MemoryService, runner: JobRunner, clock: Callable[[], float] = time.time
    ) -> None:
        self.memory = memory
        self.store = memory.store
        self.runner = runner
        self.catalog = memory.store.catalog
        self.clock = clock

    async def existing(self, keys: SessionKeys) -> SessionState:
        state = await self.store.sessions.load(keys, STATE_TAIL)
        if not state.exists:
            raise NotFound(f"session {keys.session_id!r} not found", param="session_id")
        return state

    def view(self, keys: SessionKeys, state: SessionState) -> dict[str, Any]:
        """The session's tiers, as ``GET /memory/sessions/{sid}`` returns them."""
        empty = Reconciled(prompt=(), prior=state.tail, to_record=(), new=())
        units = window_units(empty, state.tiers, self.memory.composition)
        window = [m for unit in reversed(units) for m in unit]
        rolling = state.tiers.rolling
        return {
            "session_id": keys.session_id,
            "user_id": state.user_id,
            "message_count": state.message_count,
            "turns": state.turns,
            "ended": state.ended,
            "preset": self.memory.config.preset if self.memory.config.tiers is None else None,
            "tiers_version": state.tiers.version,
            "window": [message_view(m) for m in window],
            "summaries": [s.to_data() for s in state.tiers.summaries],
            "rolling_summary": rolling.to_data() if rolling else None,
            "key_qa": [k.to_data() for k in state.tiers.key_qa],
            "facts": [f.to_data() for f in state.tiers.facts],
            "pins": [p.to_data() for p in sorted(state.pins, key=lambda p: -p.importance)],
            "pending_jobs": state.pending_jobs,
        }

    async def sessions(
        self, tenant: str, *, search: str | None = None, limit: int = 50
    ) -> list[ListedSession]:
        return await self.catalog.sessions(tenant, now=self.clock(), search=search, limit=limit)

    async def tenants(self, limit: int = 100) -> list[tuple[str, float]]:
        return await self.catalog.tenants(now=self.clock(), limit=limit)

    async def receipts(self, keys: SessionKeys) -> list[dict[str, Any]]:
        return await self.catalog.receipts(keys)

    async def recalled(self, keys: SessionKeys, receipt: dict[str, Any]) -> list[dict[str, Any]]:
        """The messages a receipt recalled, as they are stored now: ``"12"`` is message 12
        of this session, ``"<session>#5"`` message 5 of another session of the user."""
        wanted: dict[str, list[int]] = {}  # by session: one read each
        for key in receipt.get("recalled", []):
            session, _, index = key.rpartition("#")
            wanted.setdefault(session, []).append(int(index))
        found: dict[str, dict[str, Any]] = {}
        for session, indexes in wanted.items():
            source = SessionKeys(keys.tenant, session) if session else keys
            for message in await self.store.sessions.messages_at(source, indexes):
                key = f"{session}#{message.index}" if session else str(message.index)
                found[key] = {"key": key, "session_id": source.session_id,
                              **message_view(message)}  # fmt: skip
        return [found[key] for key in receipt.get("recalled", []) if key in found]

    async def add_pin(
        self,
        keys: SessionKeys,
        content: str,
        importance: float | None = None,
        source_index: int | None = None,
        quota: int | None = None,
    ) -> Pin:
        """A new manual pin, its bytes charged to the tenant's quota before it is written
        (``QuotaExceeded`` past it: ``quota``, None for none)."""
        state = await self.existing(keys)
        if len(state.pins) >= MAX_PINS:
            raise InvalidRequest(
                f"a session holds at most {MAX_PINS} pins: delete one first",
                param="content",
                code="too_many_pins",
            )
        if importance is None and source_index is not None:
            # Seed 004's heuristic scores the message the pin came from.
            source = await self.store.sessions.messages(keys, source_index, source_index)
            importance = score_importance(source[0]) if source else None
        pin = Pin(
            id=f"pin_{secrets.token_hex(6)}",
            content=content,
            importance=DEFAULT_PIN_IMPORTANCE if importance is None else importance,
            source_index=source_index,
            pin_type="manual",
            created=self.clock(),
        )
        await self._write_pin(keys, pin, len(pin_json(pin)), quota)
        return pin

    async def edit_pin(
        self,
        keys: SessionKeys,
        pin_id: str,
        content: str | None,
        importance: float | None,
        quota: int | None = None,
    ) -> Pin:
        """A pin with new content or importance, same id (an edited pin is a manual one);
        what it grows by is charged to the tenant's quota, as a new pin's bytes are."""
        state = await self.existing(keys)
        pin = next((p for p in state.pins if p.id == pin_id), None)
        if pin is None:
            raise NotFound("pin not found", param="pin_id")
        edited = replace(
            pin,
            content=pin.content if content is None else content,
            importance=pin.importance if importance is None else importance,
            pin_type="manual",
        )
        grown = max(len(pin_json(edited)) - len(pin_json(pin)), 0)
        await self._write_pin(keys, edited, grown, quota)
        return edited

    async def _write_pin(self, keys: SessionKeys, pin: Pin, nbytes: int, quota: int | None) -> None:
        """Write ``pin``, its ``nbytes`` reserved against the tenant's quota first (counted
        without one too, as a turn's bytes are), and given back if the write fails. A
        deleted pin's bytes go back with its session's erasure."""
        if nbytes <= 0:
            await self.store.sessions.add_pin(keys, pin)
            return
        ask = Ask(keys.tenant, nbytes, UNBOUNDED if quota is None else quota)
        reserved = await self.store.quotas.reserve(ask, self.clock())
        if reserved.held is None:
            raise over_quota(ask.quota)
        try:
            await self.store.sessions.add_pin(keys, pin, charged=nbytes)
        except BaseException:
            await self.store.quotas.give_back(keys.tenant, reserved.held)
            raise

    async def delete_pin(self, keys: SessionKeys, pin_id: str) -> None:
        await self.existing(keys)
        if not await self.store.sessions.delete_pin(keys, pin_id):
            raise NotFound("pin not found", param="pin_id")

    async def flush(self, keys: SessionKeys) -> tuple[int, int]:
        """Run the session's pending jobs now: (jobs run, jobs still pending)."""
        await self.existing(keys)
        ran = await self.runner.flush(keys)
        _, _, pending = await self.store.sessions.job_state(keys)
        return ran, len(pending)

    async def end(self, keys: SessionKeys) -> dict[str, Any]:
        state = await self.existing(keys)
        # Pending jobs run first, so the final summary is complete; with a user, it goes
        # to their history and their cross-session profile is rebuilt.
        await self.runner.end(keys)
        after = await self.existing(keys)
        return {**self.view(keys, after), "flushed_jobs": state.pending_jobs - after.pending_jobs}

    async def export_json(self, keys: SessionKeys) -> str:
        state = await self.existing(keys)
        messages = await self.store.sessions.messages(keys, 1, -1)
        meta = await self.store.sessions.meta(keys)
        view = self.view(keys, state)
        view["messages"] = [message_view(m) for m in messages]
        branches = await self.store.sessions.branches(keys)
        view["abandoned_branches"] = [branch_view(b) for b in branches]
        view["meta"] = {k: v for k, v in meta.items() if k in ("created", "updated", "ended")}
        return json.dumps(view, ensure_ascii=False)

    async def export_markdown(self, keys: SessionKeys) -> str:
        state = await self.existing(keys)
        messages = await self.store.sessions.messages(keys, 1, -1)
        meta = await self.store.sessions.meta(keys)
        branches = await self.store.sessions.branches(keys)
        view = self.view(keys, state)
        return session_markdown(keys.session_id, meta, state, messages, view, branches)

    async def erase(self, keys: SessionKeys) -> None:
        self.memory.archives.discard(keys)
        if not await self.store.sessions.erase_session(keys):
            raise NotFound(f"session {keys.session_id!r} not found", param="session_id")
