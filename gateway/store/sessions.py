"""A session's memory: one round trip to load it, one atomic script to record a turn;
its messages, vectors and images; its tiers (compare-and-set by the jobs), pins, end and
erasure.

Recording builds on the other parts: a turn's round trip also announces its jobs
(``queue``), joins the session to its user's index (``users``) and writes the operator's
catalog (``catalog``).
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from gateway import codec
from gateway.memory.branches import Branch
from gateway.memory.images import Blob
from gateway.memory.jobs import Job
from gateway.memory.model import Message, Pin, SessionState, Tiers
from gateway.store import catalog
from gateway.store.calls import StoreCalls, StoreFull, StoreUnavailable, pairs, refused
from gateway.store.codecs import (
    ArchivePage,
    Known,
    LoadArgs,
    LoadReply,
    LogSlice,
    Predicted,
    RecordArgs,
    Recorded,
)
from gateway.store.keys import SessionKeys, UserKeys, usage_key
from gateway.store.link import Command
from gateway.store.parsed_messages import ParsedMessages
from gateway.store.pending_jobs import Pending
from gateway.store.queue import announce
from gateway.store.quota import (
    Ask,
    Held,
    Reservation,
    reservation,
    reserve_call,
    settle_call,
    take_back_call,
)
from gateway.store.tiers_cache import TiersCache
from gateway.store.users import Joining, Users, add_user_session, ask_idle, idle_of

log = logging.getLogger(__name__)

# record.lua's ``first`` when the session is another user's.
OWNED = -2

# A user's sessions not ended yet, the latest active first, that a load brings: what a new
# session of theirs recalls from at once, before any of them ends.
ACTIVE_READ = 8


class SessionOwned(StoreUnavailable):
    """A record naming a user found the session another user's (its user is set once,
    atomically with its first user's turn): nothing was appended. Not retried."""


class TailMoved(StoreUnavailable):
    """A record that relied on the log's length found another turn had landed first.

    A kind of unavailability for the caller: when it persists the turn is not recorded and
    the answer is reported degraded.
    """


@dataclass(frozen=True, slots=True)
class Loaded:
    """A session as one request loads it: its state, the slice of its log read with it,
    and the same of each of the user's other sessions asked for (``peers``)."""

    state: SessionState
    log: LogSlice
    peers: dict[SessionKeys, LogSlice]
    # When asked for: the turn's bytes reserved against its tenant's quota, or refused;
    # None too when Redis could not say (a full Redis refuses the write: the turn goes on,
    # and its record fails the same way).
    reservation: Reservation | None = None


def pin_json(pin: Pin) -> str:
    """A pin as stored (its bytes are what a manual pin costs its tenant's quota)."""
    return json.dumps(pin.to_data())


class Sessions:
    """Sessions: the request path's load and record, and what the worker and the memory
    API read and write of a session. A session's erasure and a record's index write
    reach into its user's keys (``users``). Stored messages and tiers documents are
    parsed through the store's caches of them (``parsed``, ``tiers``)."""

    def __init__(
        self, calls: StoreCalls, users: Users, tiers: TiersCache, parsed: ParsedMessages
    ) -> None:
        self._calls = calls
        self._users = users
        self._tiers = tiers
        self._parse = parsed.parse

    # --- the request path ---

    async def load(self, keys: SessionKeys, tail: int) -> SessionState:
        """The session's state with its newest ``tail`` messages, in one round trip."""
        loaded = await self.load_turn(keys, tail)
        return loaded.state

    async def load_turn(
        self,
        keys: SessionKeys,
        tail: int,
        *,
        known: Known | None = None,
        vectors: bool = False,
        most: int = 0,
        user: UserKeys | None = None,
        peers: Sequence[tuple[SessionKeys, Known | None]] = (),
        reserve: Ask | None = None,
        now: float = 0.0,
    ) -> Loaded:
        """Everything one request needs, in one round trip: the session's meta, tiers,
        pins and pending jobs, and its log's messages after what the caller holds
        (``known``, up to ``most`` of them; else its newest ``tail``), with their vectors
        if asked; with a user, their cross-session profile and history; the same slice of
        each of ``peers``; and with ``reserve``, the turn's bytes reserved against its
        tenant's quota (at ``now``: a hold expires).

        The returned state's ``tail`` holds the messages read: the caller that holds
        more puts its own tail there."""
        at: dict[str, int] = {}
        commands = [self._load_call(LoadArgs(keys, tail, known, vectors, most))]
        at["user"] = len(commands)
        if user is not None:
            commands += [
                ("GET", user.profile),
                ("LRANGE", user.history, 0, -1),
                ("ZREVRANGE", user.active, 0, ACTIVE_READ - 1),
            ]
        at["peers"] = len(commands)
        for peer, held in peers:
            # One this process holds: what was appended since; one it does not: its newest
            # ``most`` (a short session whole, with no page read after the load).
            tail_of_peer = 0 if held is not None else most
            commands.append(self._load_call(LoadArgs(peer, tail_of_peer, held, vectors, most)))
        at["usage"] = len(commands)
        hold = None
        if reserve is not None:  # last: its error reply alone does not fail the load
            call, hold = reserve_call(self._calls, reserve, now)
            commands.append(call)

        replies = await self._calls.execute(commands, op="load_turn", needed=at["usage"])
        own = LoadReply.decode(replies[0], self._parse)
        reserved = None
        if hold is not None:
            reply = replies[at["usage"]]
            if isinstance(reply, Exception):
                log.warning("quota not reserved (the record will charge it): %s", reply)
            else:
                reserved = reservation(reply, hold)
        profile, history, active = (
            replies[at["user"] : at["peers"]] if user is not None else (None, [], [])
        )
        fields = own.fields
        user_id = fields.get(b"user_id")
        state = SessionState(
            message_count=own.log.count,
            tail=own.log.messages[-tail:] if tail > 0 else (),
            user_id=user_id.decode() if user_id else None,
            tiers=self._tiers.parse(keys, own.tiers),
            pins=tuple(Pin.from_data(codec.loads(p)) for p in own.pins),
            pending_jobs=own.pending,
            ended=b"ended" in fields,
            turns=int(fields.get(b"turns") or 0),
            exists=bool(fields),
            updated=float(fields.get(b"updated") or 0),
            profile=codec.loads(profile) if profile else None,
            history=tuple(codec.loads(h) for h in history),
            active=tuple(a.decode() if isinstance(a, bytes) else str(a) for a in active),
            forwarded=(fields.get(b"forwarded") or b"").decode("ascii", "replace"),
        )
        peer_logs = {
            peer: LoadReply.decode(reply, self._parse).log
            for (peer, _), reply in zip(peers, replies[at["peers"] : at["usage"]], strict=True)
        }
        return Loaded(state, own.log, peer_logs, reserved)

    def _load_call(self, args: LoadArgs) -> Command:
        names, argv = args.encode()
        return self._calls.script("load", names, argv)

    async def archive_page(
        self, keys: SessionKeys, start: int, stop: int, *, vectors: bool
    ) -> tuple[str, int, tuple[Message, ...], tuple[bytes | None, ...]]:
        """Messages at positions ``start``..``stop`` (0-based, inclusive) with their
        vectors; and the log's generation and length as they were read with them."""
        page = ArchivePage(keys, start, stop, vectors)
        names, argv = page.encode()
        (reply,) = await self._calls.execute(
            [self._calls.script("archive_page", names, argv)], op="archive_page"
        )
        return page.decode(reply, self._parse)

    async def messages_at(self, keys: SessionKeys, indexes: Sequence[int]) -> list[Message]:
        """Messages by index (recall hits), in the order asked; one round trip."""

        commands = [("LINDEX", keys.log, index - 1) for index in indexes]
        raw = await self._calls.execute(commands, op="messages_at") if indexes else []
        return [self._parse(r, i) for i, r in zip(indexes, raw, strict=True) if r]

    async def save_vectors(self, keys: SessionKeys, vectors: dict[int, bytes]) -> bool:
        """Store message vectors; False (nothing written) if the session no longer exists."""
        args: list[Any] = [self._calls.retention_s]
        for index, vector in vectors.items():
            args += [str(index), vector]
        call = self._calls.script("save_vectors", [keys.meta, keys.vectors], args)
        (written,) = await self._calls.execute([call], op="save_vectors")
        return bool(written)

    async def vectors(self, keys: SessionKeys, indexes: Sequence[int]) -> dict[int, bytes]:
        if not indexes:
            return {}
        (raw,) = await self._calls.execute(
            [("HMGET", keys.vectors, *(str(i) for i in indexes))], op="vectors"
        )
        return {i: v for i, v in zip(indexes, raw, strict=True) if v}

    async def media(self, keys: SessionKeys, hashes: Sequence[str]) -> dict[str, bytes]:
        """Images of the session's media hash by their SHA-256; those not there (dropped,
        expired) are left out. One round trip."""
        if not hashes:
            return {}
        (raw,) = await self._calls.execute([("HMGET", keys.media, *hashes)], op="media")
        return {sha: bytes(data) for sha, data in zip(hashes, raw, strict=True) if data}

    async def usage(self, tenant: str) -> int:
        """The bytes of messages a tenant has stored (what its quota counts)."""
        (raw,) = await self._calls.execute([("GET", usage_key(tenant))], op="usage")
        return int(raw or 0)

    async def record(
        self,
        keys: SessionKeys,
        messages: Sequence[Message],
        *,
        now: float,
        user_id: str | None,
        truncate_to: int | None = None,
        expected_count: int | None = None,
        vectors: Sequence[bytes] = (),
        predicted: Predicted | None = None,
        joining: Joining | None = None,
        receipt: catalog.StoredReceipt | None = None,
        listed: bool = True,
        record_id: str = "",
        active: UserKeys | None = None,
        media: Sequence[Blob] = (),
        forwarded: str = "",
        held: Held | None = None,
    ) -> Recorded:
        """Append messages atomically, numbering them, with their recall ``vectors``
        (stored forms, "" for none; one per message, or none at all), and the ``media``
        their image references name into the session's media hash (each once: a hash
        already there is not written again; the script gives the hash the session's TTL).

        In the same round trip: the ``predicted`` jobs and pins (written only where the
        append lands as predicted: ``Recorded.predicted``), the notices of those jobs, and
        the session ``joining`` its user's index, and the catalog's writes (the session and
        its tenant ``listed`` as active, this turn's ``receipt`` kept). A notice whose job was
        not written is harmless: a worker finds no such pending job and acknowledges it.

        The tenant's quota is charged the bytes appended, less those ``held`` for them
        (``store.quota``), in the same round trip; taken back when nothing was appended.

        Raises ``TailMoved`` when ``expected_count`` is given and the log has another length.
        """
        stored_json = [message.to_json() for message in messages]
        # An image's bytes count towards the tenant's quota with the turn that sent it
        # (again if another turn sends it again: over, never under, the bytes held).
        appended = sum(len(raw) for raw in stored_json) + sum(len(b.data) for b in media)
        call = RecordArgs(
            keys,
            stored_json,
            user_messages=sum(1 for m in messages if m.role == "user"),
            now=now,
            ttl_s=self._calls.retention_s,
            generation=secrets.token_hex(8),
            appended=appended,
            user_id=user_id,
            truncate_to=truncate_to,
            expected_count=expected_count,
            vectors=vectors,
            predicted=predicted,
            record_id=record_id,
        )
        names, argv = call.encode()
        at: dict[str, int] = {}
        commands: list[Command] = [self._calls.script("record", names, argv)]
        commands += announce(keys, predicted.jobs if predicted else (), self._calls.job_shards)
        at["indexed"] = len(commands)
        if joining is not None:
            commands += add_user_session(joining.user, keys.session_id, self._calls.retention_s)
        at["active"] = len(commands)
        if active is not None:  # this session's activity, for its user's idle check
            commands.append(("ZADD", active.active, repr(now), keys.session_id))
            commands.append(("EXPIRE", active.active, self._calls.retention_s))
        at["idle"] = len(commands)
        if joining is not None and joining.idle_before is not None:
            commands.append(ask_idle(joining.user, joining.idle_before))
        commands += catalog.write_turn(
            keys, now=now, retention_s=self._calls.retention_s, receipt=receipt, listed=listed
        )
        if forwarded:  # the context this turn forwarded, for the next turn's receipt
            commands.append(("HSET", keys.meta, "forwarded", forwarded))
        # Last, so that no reply above moves: the tenant's stored bytes (its quota).
        at["settle"] = len(commands)
        commands.append(settle_call(self._calls, keys.tenant, appended, held))
        # After it, too: their replies are not read. Safe to repeat (HSETNX).
        commands += [("HSETNX", keys.media, blob.sha256, blob.data) for blob in media]
        if media:
            commands.append(("EXPIRE", keys.media, self._calls.retention_s))

        # Only the script must succeed: the turn is recorded when it did. The rest may
        # have gone to other masters (a cluster): a notice lost with its master leaves
        # its job pending in the session, run with the session's next notice or flush;
        # a failed user index write is made again (or the turn reported degraded).
        replies = await self._calls.execute(commands, op="record", needed=0)
        settled = replies[at["settle"]]
        charged = 0 if isinstance(settled, Exception) else int(settled)
        if isinstance(replies[0], Exception):
            # The record refused (a full Redis, its master down): what was charged beside
            # it is taken back, so that a failed write leaves no bytes counted.
            await self._take_back(keys.tenant, charged)
            raise refused(replies[0])
        recorded = Recorded.decode(replies[0])
        if recorded.first < 0:
            # Nothing was appended: the bytes counted beside the script are taken back.
            await self._take_back(keys.tenant, charged)
            if recorded.first == OWNED:
                raise SessionOwned(f"session {keys.session_id!r} is another user's")
            raise TailMoved(f"expected {expected_count} messages, found {recorded.count}")
        if recorded.repeated:  # done before, and its bytes counted then
            await self._take_back(keys.tenant, charged)
        if joining is None:
            return recorded
        indexed = replies[at["indexed"] : at["active"]]
        if any(isinstance(reply, Exception) for reply in indexed):
            await self._users.index_user_session(joining.user, keys.session_id)
        if joining.idle_before is None:
            return recorded
        found = replies[at["idle"]]
        if isinstance(found, Exception):
            return recorded
        return replace(recorded, idle=tuple(s for s in idle_of(found) if s != keys.session_id))

    async def _take_back(self, tenant: str, charged: int) -> None:
        """Bytes a record charged for nothing appended; when Redis cannot take them, the
        count stays over (never under) what is stored."""
        if not charged:
            return
        try:
            await self._calls.execute(
                [take_back_call(self._calls, tenant, charged)], op="take_back"
            )
        except StoreUnavailable as error:
            log.warning("%d bytes stay counted against a quota: %s", charged, error)

    # --- the worker and the memory API ---

    async def tail(self, keys: SessionKeys, n: int) -> tuple[int, list[Message]]:
        """The session's message count and its newest ``n`` messages."""

        count, raw = await self._calls.execute(
            [("LLEN", keys.log), ("LRANGE", keys.log, -n, -1)], op="tail"
        )
        first = count - len(raw) + 1
        return int(count), [self._parse(r, first + i) for i, r in enumerate(raw)]

    async def messages(self, keys: SessionKeys, start: int, end: int) -> list[Message]:
        """Messages ``start``..``end`` (1-based, inclusive); ``end`` -1 means the last."""
        stop = end - 1 if end > 0 else -1
        (raw,) = await self._calls.execute([("LRANGE", keys.log, start - 1, stop)], op="messages")
        return [self._parse(item, start + i) for i, item in enumerate(raw)]

    async def branches(self, keys: SessionKeys) -> list[Branch]:
        """The session's abandoned branches, oldest first (see ``memory.branches``)."""
        (raw,) = await self._calls.execute([("LRANGE", keys.branches, 0, -1)], op="branches")
        return [Branch.from_json(item) for item in raw]

    async def job_state(self, keys: SessionKeys) -> tuple[bool, Tiers, list[Job]]:
        """Whether the session exists, its tiers, and its pending jobs (oldest first):
        every job read and parsed (a flush, which runs them all; ``job_view`` reads one)."""

        exists, tiers, raw_jobs = await self._calls.execute(
            [("EXISTS", keys.meta), ("GET", keys.tiers), ("HVALS", keys.jobs)], op="job_state"
        )
        jobs = sorted(
            (Job.from_data(json.loads(j)) for j in raw_jobs), key=lambda j: (j.trigger, j.id)
        )
        return bool(exists), Tiers.from_json(tiers), jobs

    async def tiers(self, keys: SessionKeys) -> tuple[bool, Tiers]:
        """Whether the session exists, and its tiers: what an edit of them reads (no job is
        read, however many are pending)."""
        exists, tiers = await self._calls.execute(
            [("EXISTS", keys.meta), ("GET", keys.tiers)], op="tiers"
        )
        return bool(exists), Tiers.from_json(tiers)

    async def job_view(self, keys: SessionKeys, job_id: str) -> tuple[bool, Tiers, Pending | None]:
        """Whether the session exists, its tiers, and job ``job_id`` if it is still
        pending: what a job's run reads, at the same cost however many jobs are pending."""
        exists, tiers, pending = await self._calls.execute(
            [("EXISTS", keys.meta), ("GET", keys.tiers), ("HGET", keys.jobs, job_id)],
            op="job_view",
        )
        return bool(exists), Tiers.from_json(tiers), Pending.from_json(pending) if pending else None

    async def write_tiers(
        self, keys: SessionKeys, expected_version: int, tiers: Tiers, job: Job
    ) -> int:
        """Compare-and-set: 1 written, 0 someone wrote first, -1 the session is gone."""
        args: list[Any] = [expected_version, tiers.to_json(), job.id, self._calls.retention_s]
        names = [keys.meta, keys.tiers, keys.jobs, keys.job_order]
        call = self._calls.script("write_tiers", names, args)
        (written,) = await self._calls.execute([call], op="write_tiers")
        return int(written)

    async def add_pin(self, keys: SessionKeys, pin: Pin, charged: int = 0) -> None:
        """Write ``pin`` (a new one, or one edited: same id); ``charged``: the bytes its
        tenant's quota was charged for it, added to the session's share (given back when
        the session is erased)."""
        commands: list[Command] = [
            ("HSET", keys.pins, pin.id, pin_json(pin)),
            ("EXPIRE", keys.pins, self._calls.retention_s),
        ]
        if charged:
            commands += [
                ("HINCRBY", keys.meta, "bytes", charged),
                ("EXPIRE", keys.meta, self._calls.retention_s),
            ]
        await self._calls.execute(commands, op="add_pin")

    async def delete_pin(self, keys: SessionKeys, pin_id: str) -> bool:
        (deleted,) = await self._calls.execute([("HDEL", keys.pins, pin_id)], op="delete_pin")
        return bool(deleted)

    async def meta(self, keys: SessionKeys) -> dict[str, str]:
        (raw,) = await self._calls.execute([("HGETALL", keys.meta)], op="meta")
        return {k.decode(): v.decode() for k, v in pairs(raw).items()}

    async def end_session(self, keys: SessionKeys, now: float) -> bool:
        """Mark the session ended; False when it no longer exists (erased meanwhile)."""
        (ended,) = await self._calls.execute(
            [self._calls.script("end", [keys.meta], [repr(now)])], op="end"
        )
        return bool(ended)

    async def erase_session(self, keys: SessionKeys) -> bool:
        """Delete every key of the session, and what its user's memory holds of it (and
        its bytes from its tenant's count)."""
        meta = await self.meta(keys)
        (deleted,) = await self._calls.execute([("DEL", *keys.all())], op="erase_session")
        if deleted and meta.get("bytes"):
            release = take_back_call(self._calls, keys.tenant, int(meta["bytes"]))
            try:
                await self._calls.execute([release], op="erase_session")
            except StoreFull as error:
                # A full Redis deletes (erasing is how room is made) but refuses to count
                # down: the count stays over what is stored rather than the erase failing.
                log.warning("an erased session's bytes stay counted: %s", error)
        await self._calls.execute([catalog.forget_session(keys)], op="erase_session")
        if meta.get("user_id"):
            await self._users.forget_user_session(
                UserKeys(keys.tenant, meta["user_id"]), keys.session_id
            )
        return bool(deleted)

    async def erase_user(self, user: UserKeys) -> int:
        """Erase each of the user's sessions, then the user's own keys."""
        sessions = await self._users.user_sessions(user)
        for session_id in sessions:
            await self.erase_session(SessionKeys(user.tenant, session_id))
        await self._calls.execute([("DEL", *user.all())], op="erase_user")
        return len(sessions)
