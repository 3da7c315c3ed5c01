"""The sessions' archives this process holds for recall, kept up to date by each load.

A load brings what was appended to a session since the process last read it; a session
the process does not hold (or holds at another generation) is read again by pages. The
user's other sessions (not ended yet, or named by their history) are prefetched with the
next load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gateway import offload
from gateway.caching import BoundedMap
from gateway.memory.archive import Archive, ArchiveCache, Indexed, index_messages, text_size
from gateway.memory.model import Message
from gateway.presets import RecallTier
from gateway.service.ports import SessionStore
from gateway.store.keys import SessionKeys, UserKeys
from gateway.store.redis_store import Known, Loaded, LogSlice
from gateway.text.embedder import StaticEmbedder

# Users remembered for prefetching their earlier sessions (a few MB at most).
RECENT_ENTRIES = 10_000
# A load reads at most this many messages appended since what the process holds of the
# session; further behind, it reads the session again by pages of ARCHIVE_PAGE.
MOST_DELTA = 512
ARCHIVE_PAGE = 2_000
# Messages parsed and indexed at once on the event loop; more go to a thread, so that a
# long session read again does not hold up the other requests.
INLINE_MESSAGES = 256
# Messages embedded on the event loop when recorded (a turn's two): an import's batch is
# embedded in a thread.
INLINE_VECTORS = 4
# A young session recalls from at most this many of its user's other sessions.
PEERS_MOST = 8


def _build(
    archive: Archive, parts: Sequence[tuple[Sequence[Message], Sequence[bytes | None]]]
) -> Archive:
    for messages, raw_vectors in parts:
        archive.extend(messages, raw_vectors)
    return archive


class Archives:
    def __init__(
        self, store: SessionStore, cache: ArchiveCache[SessionKeys], vectors: StaticEmbedder | None
    ) -> None:
        self.store = store
        self.cache = cache
        self.vectors = vectors  # None: words only (no vectors read, made or kept)
        # A prefetch hint, never trusted as data: the user's sessions this process served
        # or found named at their last request (their archives come with the next load of
        # a young session of theirs: its first turn too stays at two round trips).
        self._peers: BoundedMap[UserKeys, tuple[SessionKeys, ...]] = BoundedMap(RECENT_ENTRIES)

    def peers(self, user: UserKeys, keys: SessionKeys) -> tuple[SessionKeys, ...]:
        """The user's sessions to prefetch with a load of their session ``keys``."""
        return tuple(peer for peer in self._peers.get(user, ()) if peer != keys)

    def seen(self, user: UserKeys, keys: SessionKeys) -> None:
        """The user's session ``keys`` is served here: the first of their sessions to
        prefetch for the next new one."""
        known = self._peers.get(user, ())
        if known[:1] != (keys,):
            self._remember(user, keys, known)

    def _remember(self, user: UserKeys, keys: SessionKeys, others: Sequence[SessionKeys]) -> None:
        sessions = (keys, *(other for other in others if other != keys))
        self._peers.put(user, sessions[: PEERS_MOST + 1])

    def known(self, keys: SessionKeys) -> Known | None:
        held = self.cache.get(keys)
        return Known(held.generation, held.count) if held is not None else None

    async def archive(
        self, keys: SessionKeys, log: LogSlice, held: Archive | None, tier: RecallTier
    ) -> Archive:
        """The session's archive as of this load: what the process held, with what was
        appended since (the usual case), or read again (see ``memory.archive``)."""
        current = self.cache.get(keys)
        indexed: list[Indexed] = []
        if log.warm and current is not None and current is held:
            indexed = await self.indexed(log.messages)
            # Looked at again: a long message was indexed off the loop, and another
            # request may have changed what is held meanwhile.
            current = self.cache.get(keys)
        if log.warm and current is not None and current is held:
            if current.generation != log.generation:  # its end was replaced: drop that
                current.truncate(log.start)
                current.generation = log.generation
            skip = current.count - log.start  # read here, but already held
            if 0 <= skip <= len(log.messages):
                current.extend(log.messages[skip:], log.vectors[skip:], indexed[skip:])
                self.cache.resized(keys)
                return current
        if (
            current is not None
            and current.generation == log.generation
            and current.count == log.count
        ):
            return current  # another request brought it up to date meanwhile
        return await self._read_archive(keys, log, tier)

    async def _read_archive(self, keys: SessionKeys, log: LogSlice, tier: RecallTier) -> Archive:
        """The archive read again: the messages before the slice the load read, by pages,
        then the slice; held from now on (not when the log changed while being read)."""
        first = max(0, log.count - tier.archive_messages)
        archive = Archive(log.generation, first + 1)
        if not log.generation:  # no such session (yet, or any more: erased, expired)
            self.cache.discard(keys)
            return archive
        parts: list[tuple[Sequence[Message], Sequence[bytes | None]]] = []
        for start in range(first, log.start, ARCHIVE_PAGE):
            stop = min(start + ARCHIVE_PAGE, log.start) - 1
            generation, _, messages, raw = await self.store.archive_page(
                keys, start, stop, vectors=self.vectors is not None
            )
            if generation != log.generation:
                # Rewritten meanwhile: this request searches what it loaded, and the next
                # one reads the session again.
                alone = Archive(log.generation, log.start + 1)
                return _build(alone, [await self._embedded(log.messages, log.vectors)])
            parts.append(await self._embedded(messages, raw))
        kept = max(0, first - log.start)  # a slice longer than the archive's limit
        parts.append(await self._embedded(log.messages[kept:], log.vectors[kept:]))
        if (
            sum(len(m) for m, _ in parts) > INLINE_MESSAGES
            or sum(text_size(m) for m, _ in parts) >= offload.HEAVY_CHARS
        ):
            archive = await asyncio.to_thread(_build, archive, parts)
        else:
            _build(archive, parts)
        self.cache.put(keys, archive)
        return archive

    async def _embedded(
        self, messages: Sequence[Message], raw: Sequence[bytes | None]
    ) -> tuple[Sequence[Message], Sequence[bytes | None]]:
        """The messages with a vector each: those stored without one (recorded by a
        version before vectors, or by a gateway without them) get one made here."""
        if self.vectors is None or all(v is not None for v in raw):
            return messages, raw
        missing = [i for i, v in enumerate(raw) if v is None]
        made = await self.encode([messages[i] for i in missing])
        filled = list(raw)
        for i, vector in zip(missing, made, strict=True):
            filled[i] = vector or None
        return messages, filled

    async def encode(self, messages: Sequence[Message]) -> list[bytes]:
        """The messages' vectors in their stored form (b"" each without ``vectors``)."""
        if self.vectors is None or not messages:
            return [b""] * len(messages)
        texts = [m.recall_text for m in messages]
        if len(texts) <= INLINE_VECTORS:
            return self.vectors.encode(texts)
        return await asyncio.to_thread(self.vectors.encode, texts)

    async def indexed(self, messages: Sequence[Message]) -> list[Indexed]:
        """The messages' terms for recall: off the loop for long messages."""
        return await offload.sized(text_size(messages), index_messages, messages)

    async def current(self, keys: SessionKeys, tier: RecallTier) -> Archive:
        """The session's archive as stored now, outside a turn (a search of the memory
        API): what the process holds, brought up to date, or read."""
        generation, count, _, _ = await self.store.archive_page(keys, 0, -1, vectors=False)
        log = LogSlice(generation, count, count, False, (), ())
        return await self.archive(keys, log, self.cache.get(keys), tier)

    async def elsewhere(
        self, keys: SessionKeys, user: UserKeys | None, loaded: Loaded, tier: RecallTier
    ) -> dict[SessionKeys, Archive]:
        """The archives of the user's other sessions, for a young session to recall from:
        those not ended yet, the latest active first, then the ended ones their history
        names (as loaded with this request), at most ``PEERS_MOST``. Those the load brought
        are brought up to date; one it did not (the history changed since this process
        last saw it) is read now. A prefetched one neither names (erased) is ignored."""
        state = loaded.state
        if user is None or not tier.across_sessions or not (state.history or state.active):
            return {}
        named = [*state.active, *(entry.get("session_id") for entry in state.history)]
        ids = [sid for sid in dict.fromkeys(named) if sid and sid != keys.session_id]
        sessions = [SessionKeys(keys.tenant, sid) for sid in ids[:PEERS_MOST]]
        self._remember(user, keys, sessions)
        found = {}
        for session in sessions:
            log = loaded.peers.get(session)
            if log is None:  # not prefetched: as stored now
                found[session] = await self.current(session, tier)
            else:
                found[session] = await self.archive(session, log, self.cache.get(session), tier)
        return found

    async def grown(
        self,
        keys: SessionKeys,
        generation: str,
        appended: tuple[Message, ...],
        vectors: Sequence[bytes],
    ) -> None:
        """What the process holds of the session takes the messages just recorded, when
        they follow it directly (so the next load reads nothing more); otherwise the next
        load brings whatever it misses."""
        if not appended or self.cache.get(keys) is None:
            return
        indexed = await self.indexed(appended)
        held = self.cache.get(keys)  # (again: a long message was indexed off the loop)
        if held is None:
            return
        if held.generation == generation and held.count == appended[0].index - 1:
            held.extend(appended, vectors or [None] * len(appended), indexed)
            self.cache.resized(keys)
