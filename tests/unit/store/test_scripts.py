"""The Lua files as the store reads them: every one found, includes substituted once."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest

from gateway.store import scripts

# Every script the gateway runs, and the helper two of them include.
EXPECTED = {
    "admit",
    "archive_page",
    "change_key",
    "end",
    "fail_job",
    "job_head",
    "limit_reserve",
    "load",
    "quota_reserve",
    "quota_settle",
    "record",
    "release",
    "release_usage",
    "save_vectors",
    "slice",
    "write_tiers",
}


@pytest.fixture
def fresh_sources() -> Iterator[None]:
    scripts.source.cache_clear()
    yield
    scripts.source.cache_clear()


def test_every_script_is_shipped_and_read() -> None:
    assert set(scripts.names()) == EXPECTED
    for name in EXPECTED:
        text = scripts.source(name)
        assert "redis.call" in text or name == "slice", name
        assert "--#include" not in text, name


def test_an_include_is_replaced_by_the_files_text() -> None:
    helper = scripts.source("slice")
    for name in ("load", "archive_page"):
        text = scripts.source(name)
        assert text.count("local function slice(") == 1
        assert helper.strip() in text
        # The helper is defined before the script's body calls it.
        assert text.index("local function slice(") < text.index("slice(KEYS[2]")


def test_scripts_without_includes_are_the_files_text() -> None:
    from importlib import resources

    raw = resources.files("gateway.store").joinpath("scripts", "record.lua").read_text()
    assert scripts.source("record") == raw


def test_the_sha_is_what_redis_calls_the_source() -> None:
    for name in EXPECTED:
        assert scripts.sha(name) == hashlib.sha1(scripts.source(name).encode()).hexdigest()


def test_an_included_file_may_not_include_another(
    monkeypatch: pytest.MonkeyPatch, fresh_sources: None
) -> None:
    files = {"outer": "--#include inner.lua\nreturn 1\n", "inner": "--#include deep.lua\n"}
    monkeypatch.setattr(scripts, "_read", lambda name: files[name])
    with pytest.raises(ValueError, match=r"inner\.lua"):
        scripts.source("outer")


def test_only_a_whole_include_line_is_substituted(
    monkeypatch: pytest.MonkeyPatch, fresh_sources: None
) -> None:
    files = {
        "outer": "-- see --#include helper.lua in a comment\n--#include helper.lua\nreturn x\n",
        "helper": "local x = 1\n",
    }
    monkeypatch.setattr(scripts, "_read", lambda name: files[name])
    assert scripts.source("outer") == (
        "-- see --#include helper.lua in a comment\nlocal x = 1\nreturn x\n"
    )
