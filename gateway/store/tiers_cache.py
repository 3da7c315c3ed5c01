"""The parsed tiers document of recent sessions, reused while its stored bytes are unchanged.

Every request loads its session's tiers document (summaries, facts, key Q&A): one JSON
string that only a summarizer job rewrites, every few turns at most, and that grows with
the conversation (24 KB at 10,000 messages). Parsing it into ``Tiers`` at every request
was most of what still grew with a session's length. The load still brings the bytes (the
document is the data: a cache is never trusted in its place); what is kept is their
parse, reused only when the bytes are equal to those it was made from.

The same content-addressed idea as a stored message's parse (``parsed_messages``),
but not keyed by the bytes: a document is tens of KB, which a lookup would hash at every
request (a comparison with the one kept is cheaper), and only a session's newest version
is worth keeping, not each version until it ages out.
"""

from __future__ import annotations

from gateway.caching import BoundedMap
from gateway.memory.model import Tiers
from gateway.store.keys import SessionKeys

# Sessions whose parse is kept: the documents are the size of their bytes again, a few
# MB at most.
CACHED_SESSIONS = 1024


class TiersCache:
    def __init__(self, size: int = CACHED_SESSIONS) -> None:
        self._parsed: BoundedMap[SessionKeys, tuple[bytes, Tiers | None]] = BoundedMap(size)

    def parse(self, keys: SessionKeys, raw: bytes | None) -> Tiers:
        if not raw:
            return Tiers()
        known, parsed = self._parsed.get(keys, (b"", None))
        if parsed is not None and known == raw:
            return parsed
        tiers = Tiers.from_json(raw)
        self._parsed.put(keys, (raw, tiers))
        return tiers
