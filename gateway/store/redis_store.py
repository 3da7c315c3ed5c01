"""The Redis store, put together from its parts, one concern each:

- ``sessions``: the request path's load and record, a session's messages, vectors,
  images, tiers (compare-and-set), pins, end and erasure;
- ``users``: a user's session index, history and profile;
- ``queue``: the job stream, its consumer group, the sessions' leases;
- ``server``: PING, CONFIG and INFO, the tenant secret;
- ``base``: the client, the link every call goes through (``link``), its deadline
  (``StoreUnavailable``) and the scripts; ``codecs``: the scripts' typed arguments and
  replies; ``scripts``: the Lua files.

Callers hold one ``RedisStore`` and import its types from here.
"""

from __future__ import annotations

from gateway.store.base import StoreUnavailable, create_client
from gateway.store.codecs import Known, LogSlice, Predicted, Recorded
from gateway.store.queue import STREAM_MAXLEN, JobNotice
from gateway.store.server import ServerStore
from gateway.store.sessions import Loaded, SessionStore, TailMoved
from gateway.store.users import IDLE_BATCH, Joining

__all__ = [
    "IDLE_BATCH",
    "STREAM_MAXLEN",
    "JobNotice",
    "Joining",
    "Known",
    "Loaded",
    "LogSlice",
    "Predicted",
    "Recorded",
    "RedisStore",
    "StoreUnavailable",
    "TailMoved",
    "create_client",
]


class RedisStore(SessionStore, ServerStore):
    """Session memory in Redis, every call bounded by a deadline."""
