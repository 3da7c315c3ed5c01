"""The passthrough's path rules: nothing that could leave the upstream's prefix (pure)."""

from __future__ import annotations

import pytest

from gateway.config import PASSTHROUGH_PATHS
from gateway.errors import InvalidRequest
from gateway.routes.passthrough import _pattern, check_path


@pytest.mark.parametrize(
    ("raw", "decoded"),
    [
        (b"/v1/%2e%2e/admin", "/v1/../admin"),
        (b"/v1/%2E%2E/admin", "/v1/../admin"),
        (b"/v1/../admin", "/v1/../admin"),
        (b"/v1/./models", "/v1/./models"),
        (b"/v1/models/..", "/v1/models/.."),
        (b"/v1/..%2fteam-b/files", "/v1/../team-b/files"),
        (b"/v1/files%2F..%2Fx", "/v1/files/../x"),
        (b"/v1/files%5c..%5cx", "/v1/files\\..\\x"),
        (b"/v1/files\\..\\x", "/v1/files\\..\\x"),
        (b"/v1/models%3Fapi-version=evil", "/v1/models?api-version=evil"),
        (b"/v1/models%23x", "/v1/models#x"),
        (b"/v1/files/%252e%252e/x", "/v1/files/%2e%2e/x"),
        (b"/v1/files/a%00b", "/v1/files/a\x00b"),
        (b"/v1/files/a%0d%0ab", "/v1/files/a\r\nb"),
    ],
)
def test_a_path_that_could_leave_the_prefix_is_refused(raw: bytes, decoded: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_path(raw, decoded)
    assert refused.value.code == "invalid_path"


@pytest.mark.parametrize(
    "path",
    [b"/v1/models", b"/v1/files/file-abc123/content", b"/v1/models/gpt-4o.mini", b"/v1/a..b"],
)
def test_ordinary_paths_pass(path: bytes) -> None:
    check_path(path, path.decode())


@pytest.mark.parametrize(
    ("relative", "allowed"),
    [
        ("models", True),
        ("models/gpt-4o", True),
        ("models/a/b", False),  # "*" is one segment
        ("files/file-1/content", True),  # "**" any number
        ("embeddings", True),
        ("images/generations", True),
        ("admin/delete-all", False),
        ("organization/users", False),
        ("chat/completions/abc/messages", True),  # stored completions
        ("files", True),
        ("", False),
    ],
)
def test_the_default_allowlist_is_the_openai_api(relative: str, allowed: bool) -> None:
    assert any(_pattern(glob).fullmatch(relative) for glob in PASSTHROUGH_PATHS) is allowed
