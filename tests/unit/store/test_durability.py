"""Which Redis settings drop memory silently (pure: no Redis here)."""

from __future__ import annotations

import pytest

from gateway.store.durability import (
    durability_warnings,
    settings_from_info,
    tenant_secret_warning,
)

DURABLE = {"maxmemory-policy": "noeviction", "appendonly": "yes", "save": ""}


def test_noeviction_with_aof_is_quiet() -> None:
    assert durability_warnings(DURABLE) == []


def test_rdb_snapshots_alone_count_as_persistence() -> None:
    assert durability_warnings({**DURABLE, "appendonly": "no", "save": "3600 1 300 100"}) == []


@pytest.mark.parametrize(
    "policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-ttl"]
)
def test_every_evicting_policy_is_named_with_its_fix(policy: str) -> None:
    (warning,) = durability_warnings({**DURABLE, "maxmemory-policy": policy})
    assert f"maxmemory-policy is {policy}" in warning
    assert "noeviction" in warning


def test_no_aof_and_no_snapshots_is_named_with_its_fix() -> None:
    (warning,) = durability_warnings({**DURABLE, "appendonly": "no"})
    assert "appendonly no" in warning
    assert "appendonly yes" in warning


def test_both_problems_give_two_warnings() -> None:
    warnings = durability_warnings(
        {"maxmemory-policy": "volatile-lru", "appendonly": "no", "save": ""}
    )
    assert len(warnings) == 2


def test_an_unreadable_snapshot_schedule_with_aof_off_is_flagged_as_unknown() -> None:
    (warning,) = durability_warnings({"maxmemory-policy": "noeviction", "appendonly": "no"})
    assert "cannot be read" in warning


def test_unknown_settings_warn_about_nothing() -> None:
    assert durability_warnings({}) == []


def test_info_fields_map_to_config_names() -> None:
    info = {"maxmemory_policy": "allkeys-lru", "aof_enabled": 0, "redis_version": "7.2.4"}
    assert settings_from_info(info) == {"maxmemory-policy": "allkeys-lru", "appendonly": "no"}
    assert settings_from_info({"aof_enabled": 1}) == {"appendonly": "yes"}


def test_a_tenant_secret_in_a_redis_that_may_not_persist_is_named_with_its_fix() -> None:
    """Issue 32, finding 6: ``server.tenant_secret: null`` keeps the secret in Redis."""
    warning = tenant_secret_warning({**DURABLE, "appendonly": "no"})
    assert warning is not None and "set server.tenant_secret" in warning
    unknown = tenant_secret_warning({"appendonly": "no"})  # CONFIG disabled: no "save"
    assert unknown is not None
    assert tenant_secret_warning(DURABLE) is None
    assert tenant_secret_warning({**DURABLE, "appendonly": "no", "save": "3600 1"}) is None
    assert tenant_secret_warning({}) is None  # unknown: nothing said
