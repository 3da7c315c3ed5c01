"""The key schema's table matches its builders: every key a builder makes belongs to exactly
one family of ``SCHEMA``, every family is made by a builder, and a key of no family is
seen (tests/integration/test_key_schema.py runs the same matching over a real Redis)."""

from __future__ import annotations

import pytest

from gateway.store.keys import (
    AUTH_KEYS,
    AUTH_VERSION,
    SCHEMA,
    TENANT_SECRET_KEY,
    KeyShape,
    SessionKeys,
    TenantKeys,
    UserKeys,
    held_key,
    job_stream,
    limit_address,
    limit_counters,
    limit_scope,
    shapes_of,
    tenants_index,
    ui_login_attempts,
    ui_session,
    usage_key,
)

TENANT = "0123456789abcdef0123456789abcdef"  # as identity.tenant_id makes them
KEY_ID = "fedcba9876543210fedcba9876543210"  # as authenticator.key_id makes them


def built() -> list[str]:
    """One key of every builder (every rate-limit scope, odd ids)."""
    session = SessionKeys(TENANT, "a session {with} braces: and colons")
    user = UserKeys(TENANT, "user:{1}")
    return [
        *session.all(),
        session.listed_in,
        session.tenant_listed_in,
        *user.all(),
        *TenantKeys(TENANT).all_sessions(),
        tenants_index(15),
        job_stream(1023),
        usage_key(TENANT),
        held_key(TENANT),
        TENANT_SECRET_KEY,
        AUTH_KEYS,
        AUTH_VERSION,
        *limit_counters(limit_scope(TENANT), 29_000_000),
        *limit_counters(limit_scope(TENANT, KEY_ID), 29_000_000),
        *limit_counters(limit_address("2001:db8:1:2::/64"), 29_000_000),
        ui_session("ab" * 32),
        ui_login_attempts("cd" * 16),
    ]


@pytest.mark.parametrize("key", built())
def test_every_built_key_belongs_to_exactly_one_family(key: str) -> None:
    assert len(shapes_of(key)) == 1, (key, [s.pattern for s in shapes_of(key)])


def test_every_family_is_made_by_a_builder() -> None:
    made = {shape.pattern for key in built() for shape in shapes_of(key)}
    assert made == {shape.pattern for shape in SCHEMA}


@pytest.mark.parametrize(
    ("key", "pattern"),
    [
        (SessionKeys(TENANT, "s").meta, "mg:{<tenant>.<session>}:meta"),
        (UserKeys(TENANT, "u").active, "mg:{<tenant>.u<user>}:active"),
        (TenantKeys(TENANT).sessions(3), "mg:{<tenant>.i<n>}:sessions"),
        (limit_scope(TENANT) + ":busy", "mg:{rl.<tenant>}:<scope>:busy"),
        (
            limit_counters(limit_scope(TENANT, KEY_ID), 7)[3],
            "mg:{rl.<tenant>}:<scope>:tok.<minute>",
        ),
        (ui_session("ab" * 32), "mg:{ui}:session:<token>"),
    ],
)
def test_a_key_is_found_in_its_own_family(key: str, pattern: str) -> None:
    assert [shape.pattern for shape in shapes_of(key)] == [pattern]


@pytest.mark.parametrize(
    "stray",
    [
        "mg:{ui}:cart:" + "ab" * 32,  # an unknown family in a known tag
        f"mg:{{{TENANT}}}:quota",
        f"mg:{{{TENANT}.not-a-hash}}:meta",  # a session id used raw, not hashed
        f"mg:{{rl.{TENANT}}}:k.short:busy",
        "mg:tenants:{x1}",
        "memory-gateway:tenant-secret",
        "",
    ],
)
def test_a_key_of_no_family_is_found_in_none(stray: str) -> None:
    assert shapes_of(stray) == ()


@pytest.mark.parametrize("key", built())
def test_a_family_matches_whole_keys_only(key: str) -> None:
    assert shapes_of(key + ":x") == ()
    assert shapes_of("x" + key) == ()


def test_the_table_names_each_family_once_with_a_type_redis_answers() -> None:
    patterns = [shape.pattern for shape in SCHEMA]
    assert len(patterns) == len(set(patterns))
    assert {shape.redis_type for shape in SCHEMA} <= {
        "string", "list", "hash", "set", "zset", "stream"
    }  # fmt: skip
    assert all(shape.what and shape.ttl for shape in SCHEMA)


def test_a_pattern_with_an_unknown_placeholder_is_refused() -> None:
    with pytest.raises(KeyError):
        KeyShape("mg:{<nobody>}:x", "string", "never", "nothing")
