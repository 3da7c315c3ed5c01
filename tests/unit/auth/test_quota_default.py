"""Every tenant's storage is bounded unless the operator says otherwise (issue 32: with no
quota by default, 25 keys of 4 MiB images added 135 MB in 5 s): ``auth.quota_mb``
(1024 MB) bounds each tenant whose key names no ``quota_mb``; 0 removes the bound."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.datastructures import Headers

from gateway.auth.authenticator import Authenticator, KeyRegistry, key_id
from gateway.auth.tenancy import Tenants
from gateway.config import AuthConfig, ConfigError, parse_settings

MB = 2**20
UNSET = "gw-key-without-quota-0123"
OWN = "gw-key-with-its-quota-012"
NONE = "gw-key-without-bound-0123"


class NoSecretStore:
    async def tenant_secret(self, timeout_s: float | None = None, **_: Any) -> bytes:
        raise AssertionError("the secret is configured")


def authenticator(config: AuthConfig) -> Authenticator:
    return Authenticator(
        config,
        tenants=Tenants(NoSecretStore(), "a-configured-secret"),  # type: ignore[arg-type]
        registry=KeyRegistry(config),
        upstream_api_key=None,
    )


def quota_of(auth: Authenticator, key: str) -> int | None:
    return auth.identify(Headers({"authorization": f"Bearer {key}"})).quota_bytes


def keys_mode(**auth: Any) -> AuthConfig:
    keys = [
        {"key": UNSET, "tenant": "a"},
        {"key": OWN, "tenant": "b", "quota_mb": 5},
        {"key": NONE, "tenant": "c", "quota_mb": 0},
    ]
    return AuthConfig(mode="keys", keys=keys, **auth)


def test_every_tenant_is_bounded_by_default() -> None:
    assert AuthConfig().quota_mb == 1024
    assert quota_of(authenticator(AuthConfig()), "sk-a-client-key") == 1024 * MB  # forward
    keyed = authenticator(keys_mode())
    assert quota_of(keyed, UNSET) == 1024 * MB
    assert quota_of(keyed, OWN) == 5 * MB
    assert quota_of(keyed, NONE) is None  # 0 on the key: no bound


def test_a_key_made_through_the_admin_api_without_a_quota_gets_the_default() -> None:
    auth = authenticator(keys_mode(admin_key="an-admin-key-0123456789"))
    made = "mg-a-key-the-admin-api-made"
    auth.registry.replace("e:1", {key_id(made): b'{"id": "x", "tenant": "d", "quota_mb": null}'})
    assert quota_of(auth, made) == 1024 * MB


@pytest.mark.parametrize("off", [0, None])
def test_the_operator_removes_the_default_bound_with_0_or_null(off: float | None) -> None:
    auth = authenticator(AuthConfig(quota_mb=off))
    assert quota_of(auth, "sk-a-client-key") is None
    keyed = authenticator(keys_mode(quota_mb=off))
    assert quota_of(keyed, UNSET) is None
    assert quota_of(keyed, OWN) == 5 * MB  # a key's own quota still holds


def test_a_negative_quota_is_refused() -> None:
    with pytest.raises(ConfigError, match="quota_mb"):
        parse_settings({"auth": {"quota_mb": -1}}, environ={})
