"""Recording a turn (or an import): its messages, the jobs and pins they make due, and
what follows for the user's other sessions, in one round trip when nothing raced it."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace

from gateway.config import MemoryConfig
from gateway.errors import NotFound, PayloadTooLarge
from gateway.memory import images as media
from gateway.memory.branches import facts_after_branch
from gateway.memory.jobs import Job, schedule
from gateway.memory.model import Message, Pin, SessionState, call_texts
from gateway.memory.tiers.pins import AUTO_PIN_IMPORTANCE, requested_pin
from gateway.presets import Composition
from gateway.service.archives import Archives
from gateway.service.planning import Planner
from gateway.service.ports import Store
from gateway.service.turn import Turn, another_users, over_quota, stored_receipt
from gateway.service.turn_images import Images, ingested
from gateway.service.usage import UNKNOWN, Usage
from gateway.store.catalog import REFRESH_S, StoredReceipt
from gateway.store.keys import SessionKeys, UserKeys
from gateway.store.redis_store import (
    Ask,
    Held,
    Joining,
    Predicted,
    SessionOwned,
    StoreFull,
    StoreUnavailable,
    TailMoved,
)

log = logging.getLogger(__name__)

# A Lua script unpacks its arguments onto the stack; imports go in batches below that limit.
IMPORT_BATCH = 500


def record_bytes(messages: Sequence[Message]) -> int:
    """The text appending the messages writes (content, and tool calls' names and
    arguments), in UTF-8 bytes (their stored JSON adds a few dozen bytes each)."""
    return sum(
        len(text.encode("utf-8", "surrogatepass"))
        for message in messages
        for text in (message.text, *call_texts(message.tool_calls))
    )


def check_record_size(messages: Sequence[Message], limit: int) -> None:
    """Refuse (413) a turn that would write more than ``limit`` bytes of text at once
    (``memory.max_record_bytes``): a long history the session does not hold yet."""
    size = record_bytes(messages)
    if size > limit:
        raise PayloadTooLarge(
            f"messages: this request would add {size} bytes of history that the session "
            f"does not hold yet, past memory.max_record_bytes ({limit}); import a long "
            "history through the memory API (POST /memory/sessions/{session_id}/messages), "
            "which writes it in batches, then send the new message",
            param="messages",
        )


def record_batches(
    messages: Sequence[Message], most_messages: int, most_bytes: int
) -> Iterator[Sequence[Message]]:
    """The messages in consecutive batches of at most ``most_messages`` and, unless one
    message alone is larger, ``most_bytes`` of text."""
    start = size = 0
    for end, message in enumerate(messages):
        own = record_bytes((message,))
        if end > start and (end - start >= most_messages or size + own > most_bytes):
            yield messages[start:end]
            start, size = end, 0
        size += own
    if start < len(messages):
        yield messages[start:]


END_JOB = Job("end", 0, 0, 0)
# Records that lost a race for the tail and were planned again; each race needs another
# turn to land in between, so a few attempts are plenty.
RECORD_ATTEMPTS = 5
# The first pause before recording again when Redis was unavailable (doubling, to 0.5 s).
RETRY_PAUSE_S = 0.05


def auto_pin(content: str, source_index: int, now: float) -> Pin:
    """A pin the user asked for in a message; its id is derived, so a retry re-pins nothing."""
    digest = hashlib.sha256(f"{source_index}:{content}".encode()).hexdigest()[:12]
    return Pin(f"pin_auto_{digest}", content, AUTO_PIN_IMPORTANCE, source_index, "auto", now)


class Recorder:
    """Records a turn, or an import, with the jobs and pins it makes due."""

    def __init__(
        self,
        store: Store,
        config: MemoryConfig,
        composition: Composition,
        planner: Planner,
        archives: Archives,
        images: Images,
    ) -> None:
        self.store = store
        self.config = config
        self.composition = composition
        self.planner = planner
        self.archives = archives
        self.images = images

    async def record(
        self,
        turn: Turn,
        answer: Message,
        *,
        now: float,
        retry_s: float = 0.0,
        request_id: str | None = None,
        usage: Usage = UNKNOWN,
    ) -> None:
        """Append this turn's new messages and the answer atomically, with their jobs.

        A plan that relied on the stored tail is made again when a concurrent turn landed
        first (``TailMoved``); after ``RECORD_ATTEMPTS`` such races the turn is not recorded
        (the caller reports it degraded) rather than recorded twice.

        Redis unavailable (``StoreUnavailable``) is retried for up to ``retry_s``: a Redis
        restarting takes a moment, and the answer's acknowledgement waits for its record.
        Every attempt carries the turn's record id, so one whose reply was lost (Redis
        went away after running it) is not appended again by the next. A full Redis
        (``StoreFull``: maxmemory with noeviction) is not retried.

        ``request_id`` names the request in the stored receipt (its log line and header),
        and ``usage`` is what the upstream said the answer took.
        """
        (answer,) = await self.planner.counted_off_loop((answer,), turn.model)
        record_id = secrets.token_hex(12)
        receipt = stored_receipt(turn, now, self.config.receipts, request_id, usage)
        deadline = time.monotonic() + retry_s
        pause = RETRY_PAUSE_S
        while True:
            try:
                await self._record_once(turn, answer, now, record_id, receipt)
                return
            except SessionOwned:
                raise  # another user's session: no retry will make it this one's
            except StoreFull:
                raise  # a full Redis (noeviction): no room a moment later either
            except StoreUnavailable:
                if time.monotonic() + pause > deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(2 * pause, 0.5)

    async def _record_once(
        self,
        turn: Turn,
        answer: Message,
        now: float,
        record_id: str,
        receipt: StoredReceipt | None,
    ) -> None:
        plan, state = turn.plan, turn.state
        for attempt in range(RECORD_ATTEMPTS):
            try:
                recorded = await self._append(
                    turn.keys,
                    turn.identity.user_id,
                    (*plan.to_record, answer),
                    stored=state,
                    now=now,
                    truncate_to=plan.truncate_to if plan.branch_from is None else plan.branch_from,
                    expected_count=plan.expected_count,
                    receipt=receipt,
                    record_id=record_id,
                    blobs=turn.media,
                    forwarded=turn.forwarded,
                    held=turn.held,
                )
                if plan.branch_from is not None:
                    await self._facts_after_branch(
                        turn.keys, plan.branch_from, recorded.message_count
                    )
                return
            except TailMoved:
                if attempt == RECORD_ATTEMPTS - 1:
                    raise
            state = await self.store.sessions.load(turn.keys, self.config.reconcile_tail)
            plan = self.planner.plan_again(turn.ingested or turn.messages, state, turn.model)

    async def _facts_after_branch(self, keys: SessionKeys, kept: int, count: int) -> None:
        """After an edit: the facts read from abandoned messages go, and what follows the
        cut is read again (see ``memory.branches``). Only edits pay these round trips.

        Between the record and this write a concurrent turn may still see those facts; a
        job run meanwhile moves the tiers' version, and the write is made again."""
        if self.composition.facts is None:
            return
        for _ in range(RECORD_ATTEMPTS):
            exists, tiers = await self.store.sessions.tiers(keys)
            fixed = facts_after_branch(tiers, kept, count) if exists else None
            if fixed is None:
                return
            updated, job = fixed
            written = await self.store.sessions.write_tiers(keys, tiers.version, updated, job)
            if written == 1:
                await self.store.queue.enqueue(keys, [job])
            if written != 0:
                return
        log.warning("facts of an abandoned branch not redone: the tiers kept changing")

    async def import_messages(
        self,
        keys: SessionKeys,
        user_id: str | None,
        messages: tuple[Message, ...],
        *,
        now: float,
        quota: int | None = None,
    ) -> int:
        """Append messages as if they had been exchanged (the same policy runs); the count.

        With a ``quota`` (the tenant's), the import's bytes are reserved against it before
        anything is written (``QuotaExceeded`` when they do not fit), and what a failed
        batch and those after it held is given back."""
        model = self.planner.counter.default_model  # an import names no model
        messages, blobs = await ingested(messages)
        state = await self.store.sessions.load(keys, self.config.reconcile_tail)
        if another_users(state.user_id, user_id):
            raise _not_found(keys)  # another user's session (its user is set once)
        batches = list(record_batches(messages, IMPORT_BATCH, self.config.max_record_bytes))
        holds = [Held(self._stored_bytes(part, blobs)) for part in batches]
        if quota is not None:
            await self._reserve(keys.tenant, sum(h.nbytes for h in holds), quota, now)
        done = 0
        try:
            for part, held in zip(batches, holds, strict=True):
                batch = await self.planner.counted_off_loop(tuple(part), model)
                try:
                    state = await self._append(
                        keys, user_id, batch, stored=state, now=now, blobs=blobs,
                        held=held if quota is not None else None,
                    )  # fmt: skip
                except SessionOwned:
                    raise _not_found(keys) from None  # another user's first turn won a race
                done += 1
        finally:
            if quota is not None and done < len(holds):
                await self._give_back(keys.tenant, sum(h.nbytes for h in holds[done:]))
        return state.message_count

    def _stored_bytes(self, messages: Sequence[Message], blobs: Mapping[str, media.Blob]) -> int:
        """What recording ``messages`` charges its tenant's quota, as ``Sessions.record``
        counts it (before their timestamps and token counts are filled in: the record
        settles the difference)."""
        stored = sum(len(message.to_json()) for message in messages)
        return stored + sum(len(blob.data) for blob in self.images.kept(messages, blobs))

    async def _give_back(self, tenant: str, nbytes: int) -> None:
        """Bytes reserved for batches not written; when Redis cannot take them, the count
        stays over (never under) what is stored."""
        try:
            await self.store.quotas.give_back(tenant, Held(nbytes))
        except StoreUnavailable as error:
            log.warning("%d bytes stay counted against a quota: %s", nbytes, error)

    async def _reserve(self, tenant: str, nbytes: int, quota: int, now: float) -> None:
        """``nbytes`` charged to ``tenant``'s quota for good, or ``QuotaExceeded``."""
        reserved = await self.store.quotas.reserve(Ask(tenant, nbytes, quota), now)
        if reserved.held is None:
            raise over_quota(quota)

    async def _append(
        self,
        keys: SessionKeys,
        user_id: str | None,
        messages: tuple[Message, ...],
        *,
        stored: SessionState,
        now: float,
        truncate_to: int | None = None,
        expected_count: int | None = None,
        receipt: StoredReceipt | None = None,
        record_id: str = "",
        blobs: Mapping[str, media.Blob] | None = None,
        forwarded: str = "",
        held: Held | None = None,
    ) -> SessionState:
        """Record ``messages`` after the ``stored`` state, with the jobs and pins they make
        due, in one round trip when the log is as ``stored`` says (see ``Predicted``). A
        session new to its user finds their idle sessions in that round trip too.

        Messages keep the time they carry (an import's); the others are stamped ``now``.
        The images their references name go to the session's media hash from ``blobs``
        (``memory.media: store``; with ``drop``, nowhere).

        Returns what is known of the session afterwards (its count, turns, user and tail).
        """
        stamped = tuple(m if m.ts > 0 else m.but(ts=now) for m in messages)
        stamped = await self.planner.lined_off_loop(stamped)
        vectors = await self.archives.encode(stamped) if self.archives.vectors is not None else []
        before = (
            stored.message_count if truncate_to is None else min(stored.message_count, truncate_to)
        )
        # A truncation that abandons user messages (an edit) takes them off the turns.
        gone = sum(1 for m in stored.tail if m.index > before and m.role == "user")
        expected = self.writes(stored.tail, stamped, before, stored.turns - gone, now)
        user = UserKeys(keys.tenant, user_id) if user_id else None
        cross = self.composition.cross_session
        recorded = await self.store.sessions.record(
            keys,
            stamped,
            now=now,
            user_id=user_id,
            truncate_to=truncate_to,
            expected_count=expected_count,
            vectors=vectors,
            predicted=expected,
            joining=self._joining(user, stored, now),
            receipt=receipt,
            listed=now - stored.updated >= REFRESH_S,
            record_id=record_id,
            active=user if cross is not None else None,
            media=self.images.kept(stamped, blobs),
            forwarded=forwarded,
            held=held,
        )
        users = sum(1 for m in stamped if m.role == "user")
        if not recorded.predicted:  # another turn landed in between: the real indexes
            actual = self.writes(
                stored.tail, stamped, recorded.first - 1, recorded.turns - users, now
            )
            if actual.jobs:
                await self.store.queue.enqueue(keys, actual.jobs)
            for pin in actual.pins:
                await self.store.sessions.add_pin(keys, pin)
        if recorded.new_user and user is not None:
            foreseen = user_id != stored.user_id
            if not foreseen:  # a concurrent turn changed the session's user meanwhile
                await self.store.users.index_user_session(user, keys.session_id)
            if foreseen and cross is not None:
                await self._end_sessions(user, recorded.idle)
            else:
                await self._end_idle_sessions(user, keys, now)
        appended = tuple(m.but(index=recorded.first + i) for i, m in enumerate(stamped))
        await self.archives.grown(keys, recorded.generation, appended, vectors)
        history = tuple(m for m in stored.tail if m.index < recorded.first) + appended
        return replace(
            stored,
            message_count=recorded.count,
            turns=recorded.turns,
            user_id=user_id or stored.user_id,
            tail=history[-self.config.reconcile_tail :],
        )

    def writes(
        self,
        tail: tuple[Message, ...],
        messages: tuple[Message, ...],
        count_before: int,
        turns_before: int,
        now: float,
    ) -> Predicted:
        """The jobs and automatic pins that appending ``messages`` after ``count_before``
        stored messages makes due (pure: jobs and pin ids derive from the indexes)."""
        appended = tuple(m.but(index=count_before + 1 + i) for i, m in enumerate(messages))
        history = tuple(m for m in tail if m.index <= count_before) + appended
        jobs = schedule(
            self.composition, history, count_before=count_before, turns_before=turns_before
        )
        pins = []
        if self.composition.pins is not None and self.composition.pins.auto_pin:
            for message in appended:
                content = requested_pin(message)
                if content is not None:
                    pins.append(auto_pin(content, message.index, now))
        return Predicted(count_before + 1, turns_before, tuple(jobs), tuple(pins))

    def _joining(self, user: UserKeys | None, stored: SessionState, now: float) -> Joining | None:
        """A session new to its user joins their index in the record's round trip, and
        (with cross-session memory) finds those of their sessions gone idle there too."""
        if user is None or user.user_id == stored.user_id:
            return None
        cross = self.composition.cross_session
        return Joining(user, None if cross is None else now - cross.idle_end_s)

    async def _end_idle_sessions(self, user: UserKeys, keys: SessionKeys, now: float) -> None:
        """A user starting a session ends their idle ones, so their final summaries reach
        the cross-session profile; the worker does the work."""
        cross = self.composition.cross_session
        if cross is None:
            return
        idle = await self.store.users.idle_sessions(
            user, idle_before=now - cross.idle_end_s, exclude=keys.session_id
        )
        await self._end_sessions(user, idle)

    async def _end_sessions(self, user: UserKeys, session_ids: Sequence[str]) -> None:
        await self.store.queue.end_sessions(user, session_ids, END_JOB)


def _not_found(keys: SessionKeys) -> NotFound:
    return NotFound(f"session {keys.session_id!r} not found", param="session_id")
