"""A key refused for its length is told so (issue 34): a 7-character key got the same
"an API key is required" as no key at all, which sent its user looking for a missing
header instead of a longer key."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.datastructures import Headers

from gateway.auth.authenticator import Authenticator, KeyRegistry
from gateway.auth.tenancy import Tenants
from gateway.config import AuthConfig
from gateway.errors import Unauthorized


class NoStore:
    async def tenant_secret(self, timeout_s: float | None = None, **_: Any) -> bytes:
        raise AssertionError("refused before any tenant is resolved")


def refusal(authorization: str | None) -> Unauthorized:
    config = AuthConfig()
    auth = Authenticator(
        config,
        tenants=Tenants(NoStore(), "a-configured-secret"),  # type: ignore[arg-type]
        registry=KeyRegistry(config),
        upstream_api_key=None,
    )
    headers = Headers({"authorization": authorization} if authorization is not None else {})
    with pytest.raises(Unauthorized) as refused:
        auth.identify(headers)
    return refused.value


@pytest.mark.parametrize("key", ["abcdefg", "sk-abcd", " 1234567 "])
def test_a_short_key_is_told_it_is_too_short(key: str) -> None:
    refused = refusal(f"Bearer {key}")
    assert refused.code == "invalid_api_key"
    assert "too short" in refused.message
    assert "8 characters or more (this one has 7)" in refused.message
    assert "required" not in refused.message


@pytest.mark.parametrize("authorization", [None, "Bearer ", "Bearer EMPTY", "Bearer ollama"])
def test_no_key_or_a_placeholder_is_still_a_missing_key(authorization: str | None) -> None:
    refused = refusal(authorization)
    assert refused.code == "missing_api_key"
    assert "an API key is required" in refused.message
