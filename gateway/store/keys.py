"""The whole Redis key schema.

Every key of one session carries the same hash tag ``{<tenant>.<session>}`` so that the
session's atomic append (a Lua script) stays in one Redis Cluster slot. The session id
enters keys only as a hash: ids may hold any printable character, braces included, which
would otherwise break the tag; the id itself is kept in the session's meta hash.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

PREFIX = "mg"
TENANT_SECRET_KEY = f"{PREFIX}:tenant-secret"


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """Key builders for one tenant's session."""

    tenant: str
    session_id: str

    @property
    def tag(self) -> str:
        sid = hashlib.sha256(self.session_id.encode()).hexdigest()[:24]
        return f"{{{self.tenant}.{sid}}}"

    @property
    def meta(self) -> str:
        """HASH: sid, user_id, created, updated."""
        return f"{PREFIX}:{self.tag}:meta"

    @property
    def log(self) -> str:
        """LIST: every recorded message as JSON; position + 1 is the message index."""
        return f"{PREFIX}:{self.tag}:log"

    def all(self) -> tuple[str, ...]:
        return (self.meta, self.log)
