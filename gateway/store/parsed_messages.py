"""The parses of stored messages a store has read, kept by their bytes and place in the log.

Consecutive turns of a session read the same stored tail again, less one or two
messages, and every request parses what it reads. A stored message never changes, so
its parse is remembered by its bytes and its place: a content-addressed cache, which
cannot be stale whoever wrote since (another replica, an erasure: erased bytes are
simply never read again). Nothing mutates a ``Message``'s content. Bounded in entries,
and a long message is parsed each time rather than kept.

One per store (built with the ``RedisStore``, shared by its ``with_deadline`` views),
not one per process: each app, and each test, starts with none.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.caching import memo_when_short
from gateway.memory.model import Message

# A message longer than this (its stored JSON) is parsed each time: a pasted document
# would take the room of hundreds of short messages.
KEPT_CHARS = 4096
# Entries kept: a few hundred sessions' tails (memory.reconcile_tail messages each).
KEPT_MESSAGES = 8192

ParseMessage = Callable[[str | bytes, int], Message]


class ParsedMessages:
    """A store's parses of stored messages (``parse``: ``Message.from_json``, remembered)."""

    def __init__(self, *, kept_chars: int = KEPT_CHARS, size: int = KEPT_MESSAGES) -> None:
        self.parse: ParseMessage = memo_when_short(limit=kept_chars, maxsize=size)(
            Message.from_json
        )
