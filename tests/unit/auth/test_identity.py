"""Tenant ids, bearer keys, session/user id checks and the memory mode header."""

from __future__ import annotations

import unicodedata

import pytest
from starlette.datastructures import Headers

from gateway.auth.identity import (
    MAX_ID_LENGTH,
    MemoryMode,
    bearer_key,
    check_id,
    header_id,
    memory_mode,
    tenant_id,
)
from gateway.errors import InvalidRequest

SECRET = b"s" * 32


def test_tenant_id_is_deterministic() -> None:
    assert tenant_id(SECRET, "sk-abc") == tenant_id(SECRET, "sk-abc")


def test_tenant_id_is_hmac_sha256_prefix() -> None:
    # Known value: HMAC-SHA256(b"secret", b"sk-test"), first 32 hex digits.
    assert tenant_id(b"secret", "sk-test") == "cc6682ce59c1660c961b067ad357185f"


@pytest.mark.parametrize(
    ("secret_a", "key_a", "secret_b", "key_b"),
    [
        (SECRET, "sk-abc", SECRET, "sk-abd"),
        (SECRET, "sk-abc", SECRET, "sk-abc "),
        (SECRET, "", SECRET, "x"),
        (b"one", "sk-abc", b"two", "sk-abc"),
    ],
)
def test_tenant_id_differs(secret_a: bytes, key_a: str, secret_b: bytes, key_b: str) -> None:
    assert tenant_id(secret_a, key_a) != tenant_id(secret_b, key_b)


@pytest.mark.parametrize("key", ["sk-abc", "sk-proj-" + "x" * 100, "", "clé-ünïcode", "a"])
def test_tenant_id_shape_and_never_contains_the_key(key: str) -> None:
    tenant = tenant_id(SECRET, key)
    assert len(tenant) == 32
    assert all(ch in "0123456789abcdef" for ch in tenant)
    if len(key) >= 4:
        assert key not in tenant


@pytest.mark.parametrize(
    ("authorization", "expected"),
    [
        ("Bearer sk-abc", "sk-abc"),
        ("bearer sk-abc", "sk-abc"),
        ("BEARER sk-abc", "sk-abc"),
        ("Bearer   sk-abc  ", "sk-abc"),
        ("Bearer ", ""),
        ("sk-raw", "sk-raw"),
        ("  sk-raw  ", "sk-raw"),
        ("Basic dXNlcjpwYXNz", "Basic dXNlcjpwYXNz"),
        ("", ""),
    ],
)
def test_bearer_key(authorization: str, expected: str) -> None:
    assert bearer_key(Headers({"authorization": authorization})) == expected


def test_bearer_key_without_header() -> None:
    assert bearer_key(Headers({})) == ""


@pytest.mark.parametrize(
    "value",
    [
        "a",
        "x" * MAX_ID_LENGTH,
        "é" * MAX_ID_LENGTH,  # 128 characters, 256 bytes
        "🎉" * MAX_ID_LENGTH,
        "session {42} [alpha] <b>",
        "{{braces}}",
        "user@example.com",
        "日本語のセッション",
        "with space",
        "back\\quote'double\"%2F?#",
    ],
)
def test_check_id_accepts(value: str) -> None:
    assert check_id(value, "X-Session-Id") == value


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "characters long"),
        ("x" * (MAX_ID_LENGTH + 1), "characters long"),
        ("é" * (MAX_ID_LENGTH + 1), "characters long"),
        ("line\nbreak", "control characters"),
        ("a/b", "must not contain '/'"),  # unreachable as one path segment of the memory API
        ("nul\x00", "control characters"),
        ("del\x7f", "control characters"),
        ("tab\there", "control characters"),
        ("cr\r", "control characters"),
        ("\x1b[31mred", "control characters"),
        ("zero\u200bwidth", "control characters"),  # Cf: format
        ("bidi\u202eoverride", "control characters"),  # Cf
        ("bom\ufeff", "control characters"),  # Cf
        ("private\ue000use", "control characters"),  # Co
        ("unassigned\U000e0080", "control characters"),  # Cn
        ("c1\x85", "control characters"),  # Cc (NEL)
    ],
)
def test_check_id_rejects(value: str, reason: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_id(value, "X-User-Id")
    error = caught.value
    assert error.status == 400
    assert error.param == "X-User-Id"
    assert error.code == "invalid_header"
    assert reason in error.message
    assert error.body()["error"]["type"] == "invalid_request_error"


def raw_headers(name: str, value: bytes) -> Headers:
    """Headers as an ASGI server hands them over: the client's bytes, decoded as latin-1."""
    return Headers(raw=[(name.lower().encode("latin-1"), value)])


@pytest.mark.parametrize("value", ["s-1", "café", "日本語", "🎉" * MAX_ID_LENGTH, "{braces}"])
def test_header_id_decodes_utf8(value: str) -> None:
    headers = raw_headers("X-Session-Id", value.encode("utf-8"))
    assert header_id(headers, "X-Session-Id") == value


def test_header_id_absent_is_none() -> None:
    assert header_id(Headers({"x-other": "1"}), "X-Session-Id") is None


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\xff\xfe", "UTF-8"),
        (b"caf\xe9", "UTF-8"),  # latin-1 "café"
        (b"\xe2\x82", "UTF-8"),  # truncated sequence
        (b"", "characters long"),
        ("é".encode() * (MAX_ID_LENGTH + 1), "characters long"),
        ("a\u200bb".encode(), "control characters"),
        (b"a\x7fb", "control characters"),
    ],
)
def test_header_id_rejects(value: bytes, reason: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        header_id(raw_headers("X-User-Id", value), "X-User-Id")
    assert caught.value.status == 400
    assert caught.value.param == "X-User-Id"
    assert caught.value.code == "invalid_header"
    assert reason in caught.value.message


def test_rejected_characters_are_category_c() -> None:
    for ch in "\n\x00\x7f\u200b\u202e\ufeff\ue000\x85":
        assert unicodedata.category(ch).startswith("C"), repr(ch)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, MemoryMode.ON),
        ("on", MemoryMode.ON),
        ("ON", MemoryMode.ON),
        ("read", MemoryMode.READ),
        ("Read", MemoryMode.READ),
        (" off ", MemoryMode.OFF),
        ("OFF", MemoryMode.OFF),
    ],
)
def test_memory_mode(header: str | None, expected: MemoryMode) -> None:
    headers = Headers({} if header is None else {"X-Memory-Mode": header})
    assert memory_mode(headers) is expected


@pytest.mark.parametrize("header", ["", "yes", "true", "write", "o n", "on,off"])
def test_memory_mode_invalid(header: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        memory_mode(Headers({"x-memory-mode": header}))
    assert caught.value.status == 400
    assert caught.value.param == "X-Memory-Mode"
    assert "on, read, off" in caught.value.message
