"""Who is asking: the tenant (a keyed hash of the bearer key) and the session/user ids.

The bearer key itself never leaves this module except to go upstream: memory is keyed by
``HMAC-SHA256(secret, key)``, so a Redis dump reveals neither keys nor a way to test
guesses without the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import unicodedata
from dataclasses import dataclass
from enum import Enum

from starlette.datastructures import Headers

from gateway.errors import InvalidRequest

MAX_ID_LENGTH = 128


class MemoryMode(Enum):
    ON = "on"  # inject memory and record the exchange
    READ = "read"  # inject memory, record nothing
    OFF = "off"  # forward as sent


@dataclass(frozen=True, slots=True)
class Identity:
    tenant: str
    session_id: str
    user_id: str | None
    mode: MemoryMode
    quota_bytes: int | None = None  # the tenant's stored bytes allowed (None: no quota)
    # The users whose sessions it may use (None: any session of the tenant).
    users: frozenset[str] | None = None


def single_header(headers: Headers, header: str) -> str | None:
    """The one value of a header the gateway acts on; None when absent. Two are refused
    (400): with Authorization the gateway would check one and an upstream might use the
    other; with X-Session-Id, X-User-Id or X-Memory-Mode the gateway would take the first
    while a proxy or log in front of it may have taken the last."""
    found = headers.getlist(header)
    if len(found) > 1:
        raise InvalidRequest(f"send one {header} header", param=header, code="invalid_header")
    return found[0] if found else None


def bearer_key(headers: Headers) -> str:
    """The key a request carries (one Authorization header at most)."""
    value = single_header(headers, "Authorization") or ""
    scheme, _, key = value.partition(" ")
    return key.strip() if scheme.lower() == "bearer" else value.strip()


def tenant_id(secret: bytes, key: str) -> str:
    return hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()[:32]


def header_id(headers: Headers, header: str) -> str | None:
    """A session or user id header, checked; None when absent.

    ASGI servers decode header bytes as latin-1, clients send UTF-8: decode the bytes
    again so that "café" is one id whichever way it arrives.
    """
    raw = single_header(headers, header)
    if raw is None:
        return None
    try:
        value = raw.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(
            f"{header} must be valid UTF-8", param=header, code="invalid_header"
        ) from None
    return check_id(value, header)


def has_control_characters(value: str) -> bool:
    """Whether a text holds a character of Unicode's "Other" categories: control, format
    (bidi overrides, zero-width), surrogate, private use or unassigned."""
    return any(unicodedata.category(ch)[0] == "C" for ch in value)


def check_id(value: str, header: str) -> str:
    """Session and user ids: 1 to 128 printable characters, no control characters and no
    "/": every id the proxy takes is reachable as one path segment of the memory API
    (``/memory/sessions/{id}``, percent-encoded), where a "/" would end the segment."""
    if not value or len(value) > MAX_ID_LENGTH:
        raise InvalidRequest(
            f"{header} must be 1 to {MAX_ID_LENGTH} characters long",
            param=header,
            code="invalid_header",
        )
    if has_control_characters(value):
        raise InvalidRequest(
            f"{header} must not contain control characters", param=header, code="invalid_header"
        )
    if "/" in value:
        raise InvalidRequest(f"{header} must not contain '/'", param=header, code="invalid_header")
    return value


def memory_mode(headers: Headers) -> MemoryMode:
    sent = single_header(headers, "X-Memory-Mode")
    raw = "on" if sent is None else sent.strip().lower()
    try:
        return MemoryMode(raw)
    except ValueError:
        raise InvalidRequest(
            "X-Memory-Mode must be one of: on, read, off",
            param="X-Memory-Mode",
            code="invalid_header",
        ) from None
