"""The YAML configuration: defaults, validation messages, ${VAR} expansion."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from gateway.config import (
    ConfigError,
    MemoryConfig,
    RedisConfig,
    Settings,
    UpstreamConfig,
    expand_env,
    load_settings,
    parse_settings,
)
from gateway.presets import PRESETS, StableLayout

REPO = Path(__file__).resolve().parents[2]


def test_defaults() -> None:
    settings = Settings()
    assert settings.server.host == "127.0.0.1"
    assert settings.server.port == 8080
    assert settings.server.max_body_bytes == 32 * 1024 * 1024
    assert settings.server.max_media_bytes == 20 * 1024 * 1024
    assert settings.upstream.max_request_bytes == 32 * 1024 * 1024
    assert settings.memory.media == "store"
    assert settings.server.tenant_secret is None
    assert settings.upstream.base_url == "https://api.openai.com/v1"
    assert settings.upstream.api_key is None
    assert settings.upstream.timeouts.first_byte_s == 120.0
    assert settings.redis.url == "embedded"
    assert settings.redis.on_failure == "open"
    assert settings.memory.preset == "hybrid-recall"
    assert settings.memory.budget_tokens == 3000
    assert settings.memory.composition == PRESETS["hybrid-recall"]
    assert settings.memory.composition.window.messages == 8
    assert settings.memory.composition.recall is not None
    assert settings.summarizer.model == "gpt-4o-mini"


@pytest.mark.parametrize("data", [None, {}], ids=["empty file", "empty mapping"])
def test_empty_document_gives_defaults(data: Any) -> None:
    assert parse_settings(data, environ={}) == Settings()


def test_repo_config_file_equals_defaults() -> None:
    assert load_settings(REPO / "config" / "gateway.yaml") == Settings()
    assert load_settings(REPO / "config" / "gateway.yaml", environ={}) == Settings()


def test_repo_config_file_shows_every_key() -> None:
    """It says it shows every key with its default: a key left out still loads (as its
    default), so only this finds one missing (twelve were, added over two rounds)."""
    text = re.sub(r"\$\{[^}]*\}", "x", (REPO / "config" / "gateway.yaml").read_text())
    document = yaml.safe_load(text)

    def missing(model: type[BaseModel], section: Any, prefix: str) -> list[str]:
        found = []
        for name, field in model.model_fields.items():
            if not isinstance(section, dict) or name not in section:
                found.append(prefix + name)
                continue
            inner = field.annotation
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                found += missing(inner, section[name], f"{prefix}{name}.")
        return found

    assert missing(Settings, document, "") == []


def test_load_settings_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text("server:\n  port: 9000\nmemory:\n  preset: progressive\n", encoding="utf-8")
    settings = load_settings(path, environ={})
    assert settings.server.port == 9000
    assert settings.memory.composition.window.tokens == 4000
    assert settings.memory.composition.window.after_summarized is True
    assert settings.upstream == UpstreamConfig()


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "nope.yaml")


def test_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("server: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(path)


@pytest.mark.parametrize("data", [[1, 2], "text", 5])
def test_top_level_must_be_a_mapping(data: Any) -> None:
    with pytest.raises(ConfigError, match=r"^\(top level\)"):
        parse_settings(data, environ={})


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"servr": {}}, "servr"),
        ({"server": {"prot": 1}}, "server.prot"),
        ({"upstream": {"timeouts": {"connect": 1}}}, "upstream.timeouts.connect"),
        ({"memory": {"window": 3}}, "memory.window"),
    ],
)
def test_unknown_key_names_its_path(data: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(data, environ={})
    assert str(caught.value) == f"{path}: unknown key"


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"server": {"port": "eighty"}}, "server.port"),
        ({"server": {"port": 70000}}, "server.port"),
        ({"server": {"require_session": "perhaps"}}, "server.require_session"),
        ({"server": {"log_level": "loud"}}, "server.log_level"),
        ({"upstream": {"timeouts": {"connect_s": "soon"}}}, "upstream.timeouts.connect_s"),
        ({"upstream": {"timeouts": {"idle_s": 0}}}, "upstream.timeouts.idle_s"),
        ({"redis": {"on_failure": "maybe"}}, "redis.on_failure"),
        ({"memory": {"preset": "everything"}}, "memory.preset"),
        ({"memory": {"budget_tokens": -1}}, "memory.budget_tokens"),
        ({"memory": {"window_messages": 0}}, "memory.window_messages"),
        ({"upstream": "https://x"}, "upstream"),
    ],
)
def test_wrong_type_names_its_path(data: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(data, environ={})
    assert str(caught.value).startswith(f"{path}: ")
    assert "unknown key" not in str(caught.value)


def test_several_errors_are_all_reported() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings({"server": {"port": "x", "bogus": 1}}, environ={})
    message = str(caught.value)
    assert "server.port: " in message
    assert "server.bogus: unknown key" in message


@pytest.mark.parametrize(
    "url", ["api.openai.com/v1", "ftp://host/v1", "http://", "https:///v1", "", "localhost:8000"]
)
def test_invalid_base_url(url: str) -> None:
    with pytest.raises(ConfigError, match=r"^upstream: .*base_url must start with http"):
        parse_settings({"upstream": {"base_url": url}}, environ={})


@pytest.mark.parametrize(
    "url", ["http://localhost:8000/v1", "https://api.openai.com/v1", "http://10.0.0.2"]
)
def test_valid_base_url(url: str) -> None:
    assert UpstreamConfig(base_url=url).base_url == url


@pytest.mark.parametrize(
    "url", ["embedded", "redis://localhost:6379/0", "rediss://h:6380", "unix:///tmp/r.sock"]
)
def test_valid_redis_url(url: str) -> None:
    assert parse_settings({"redis": {"url": url}}, environ={}).redis.url == url


@pytest.mark.parametrize(
    "url", ["localhost:6379", "http://localhost:6379", "Embedded", "", "redis:/x"]
)
def test_invalid_redis_url(url: str) -> None:
    with pytest.raises(ConfigError, match=r"^redis: .*url must be 'embedded'"):
        parse_settings({"redis": {"url": url}}, environ={})


def test_window_overrides_preset() -> None:
    memory = MemoryConfig(preset="progressive", window_messages=5, window_tokens=100)
    assert memory.composition.window.messages == 5
    assert memory.composition.window.tokens == 100
    assert memory.composition.chunks == PRESETS["progressive"].chunks


def test_the_stable_layout_is_the_presets_on_off_or_its_own() -> None:
    def layout(value: Any) -> Any:
        memory = {"preset": "hybrid-recall", "stable_layout": value}
        return parse_settings({"memory": memory}, environ={}).memory.composition.stable

    assert layout(None) is None  # the preset's: hybrid-recall rebuilds its memory message
    assert layout(True) == StableLayout()
    assert layout(False) is None
    assert layout({"recall_share": 0.3}) == StableLayout(recall_share=0.3)
    counted = {"preset": "hybrid-recall", "stable_layout": True, "window_messages": 20}
    stable = parse_settings({"memory": counted}, environ={}).memory.composition.stable
    assert stable is not None and stable.window_messages == 20
    with pytest.raises(ConfigError) as caught:
        layout({"recall_shares": 0.3})
    # The key named, not the union's other kind ("should be a valid boolean").
    assert str(caught.value) == "memory.stable_layout.recall_shares: unknown key"
    with pytest.raises(ConfigError) as caught:
        layout({"memory_share": 0.5, "window_share": 0.4, "recall_share": 0.3})
    assert "at most 1" in str(caught.value)
    with pytest.raises(ConfigError):
        layout("yes")  # true or false, not a word that reads like one
    prompt_cache = parse_settings({"upstream": {"prompt_cache": {"policy": "prefix"}}}, environ={})
    assert prompt_cache.upstream.prompt_cache.policy == "prefix"
    with pytest.raises(ConfigError):
        parse_settings({"upstream": {"prompt_cache": {"policy": "anthropic"}}}, environ={})


def test_custom_composition_replaces_the_preset() -> None:
    settings = parse_settings(
        {"memory": {"preset": "hybrid", "tiers": {
            "window": {"messages": 4},
            "chunks": {"first_at": 10, "every": 10, "size": 10, "use": 2},
            "facts": {"use": 5},
            "priority": ["window_keep", "facts", "summaries", "window"],
        }}},
        environ={},
    )  # fmt: skip
    composition = settings.memory.composition
    assert composition.window.messages == 4 and composition.pins is None
    assert composition.chunks is not None and composition.chunks.every == 10


@pytest.mark.parametrize(
    ("tiers", "path"),
    [
        ({"chunks": {"evry": 3}}, "memory.tiers.chunks.evry: unknown key"),
        ({"priority": ["window", "bogus"]}, "memory.tiers.priority.1"),
        ({"recursive": {}, "rolling": {}}, "memory.tiers: Value error, recursive and rolling"),
    ],
)
def test_bad_custom_composition_names_the_key(tiers: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(path)):
        parse_settings({"memory": {"tiers": tiers}}, environ={})


def test_sections_are_frozen() -> None:
    redis = RedisConfig()
    with pytest.raises(ValueError, match="frozen"):
        redis.url = "redis://x"  # type: ignore[misc]


# --- ${VAR} expansion ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "environ", "expected"),
    [
        ("${KEY}", {"KEY": "sk-1"}, "sk-1"),
        ("${KEY:-fallback}", {}, "fallback"),
        ("${KEY:-fallback}", {"KEY": "set"}, "set"),
        ("${KEY:-}", {"KEY": "set"}, "set"),
        ("Bearer ${KEY}", {"KEY": "k"}, "Bearer k"),
        ("http://${HOST}:${PORT:-8000}/v1", {"HOST": "h"}, "http://h:8000/v1"),
        ("${A}${B}", {"A": "1", "B": "2"}, "12"),
        ("${KEY:-a:b/c}", {}, "a:b/c"),
        ("no variables", {}, "no variables"),
        ("$KEY and {KEY}", {"KEY": "x"}, "$KEY and {KEY}"),
        ("${KEY}", {"KEY": ""}, None),
        ("${KEY:-}", {}, None),
        ("${KEY}", {"KEY": "null"}, None),
        ("${KEY}", {"KEY": "~"}, None),
        ("prefix-${KEY}", {"KEY": ""}, "prefix-"),
        ("null", {}, "null"),
        ("", {}, ""),
        (5, {}, 5),
        (None, {}, None),
        (True, {}, True),
    ],
)
def test_expand_env(value: Any, environ: dict[str, str], expected: Any) -> None:
    assert expand_env(value, environ) == expected


def test_expand_env_walks_mappings_and_lists() -> None:
    data = {"a": {"b": ["${X}", {"c": "${Y:-d}"}], "n": 3}}
    assert expand_env(data, {"X": "x"}) == {"a": {"b": ["x", {"c": "d"}], "n": 3}}


def test_unset_variable_without_default_names_key_and_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings({"upstream": {"api_key": "${OPENAI_KEY}"}}, environ={"OTHER": "x"})
    assert str(caught.value) == "upstream.api_key: environment variable OPENAI_KEY is not set"


def test_unset_variable_in_a_list_names_the_item() -> None:
    with pytest.raises(ConfigError) as caught:
        expand_env({"a": {"b": ["ok", "in ${MISSING} text"]}}, {})
    assert str(caught.value) == "a.b.1: environment variable MISSING is not set"


def test_expansion_feeds_validation() -> None:
    settings = parse_settings(
        {
            "server": {"port": "${PORT}", "require_session": "${REQ:-true}"},
            "upstream": {"base_url": "${BASE}", "api_key": "${KEY}"},
            "summarizer": {"api_key": "${SUM_KEY:-}"},
        },
        environ={"PORT": "9001", "BASE": "http://llm:8000/v1", "KEY": ""},
    )
    assert settings.server.port == 9001
    assert settings.server.require_session is True
    assert settings.upstream.base_url == "http://llm:8000/v1"
    assert settings.upstream.api_key is None
    assert settings.summarizer.api_key is None


def test_expanded_value_is_still_validated() -> None:
    with pytest.raises(ConfigError, match=r"^server\.port: "):
        parse_settings({"server": {"port": "${PORT}"}}, environ={"PORT": "not-a-port"})


def test_process_environment_used_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_TEST_BASE", "http://from-env:1/v1")
    settings = parse_settings({"upstream": {"base_url": "${GW_TEST_BASE}"}})
    assert settings.upstream.base_url == "http://from-env:1/v1"


@pytest.mark.parametrize(
    ("given", "url", "tls"),
    [
        ({"url": "redis+cluster://10.0.0.5:7000"}, "redis://10.0.0.5:7000", False),
        ({"url": "rediss+cluster://:pw@h:7000/0"}, "rediss://:pw@h:7000/0", True),
        ({"url": "redis://10.0.0.5:7000", "cluster": True}, "redis://10.0.0.5:7000", False),
    ],
)
def test_a_cluster_is_named_by_its_scheme_or_by_cluster_true(
    given: dict[str, Any], url: str, tls: bool
) -> None:
    redis = parse_settings({"redis": given}, environ={}).redis
    assert (redis.url, redis.cluster, redis.url.startswith("rediss")) == (url, True, tls)


@pytest.mark.parametrize("url", ["embedded", "unix:///tmp/r.sock"])
def test_a_cluster_is_reached_over_tcp_only(url: str) -> None:
    with pytest.raises(ConfigError, match="redis"):
        parse_settings({"redis": {"url": url, "cluster": True}}, environ={})


def test_job_shards_are_bounded() -> None:
    assert parse_settings({}, environ={}).worker.job_shards == 4
    with pytest.raises(ConfigError, match="job_shards"):
        parse_settings({"worker": {"job_shards": 0}}, environ={})


def test_check_config_never_prints_the_redis_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.cli import main

    path = tmp_path / "gateway.yaml"
    path.write_text('redis: {url: "redis://user:s3cret-pw@localhost:6379/0"}\n')
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "s3cret-pw" not in out and "redis://user:***@localhost:6379/0" in out


@pytest.mark.parametrize(
    "key",
    ["", "  ", "EMPTY", "empty", "\uff25\uff2d\uff30\uff34\uff39",  # full-width EMPTY
     "Bearer EMPTY", "bearer\tollama", "sk-no-key-required", "undefined", "YOUR_API_KEY",
     "sk-xxxx", "sk-1234", "sk-...", "vllm", "short1"],
)  # fmt: skip
def test_placeholder_keys_are_no_keys(key: str) -> None:
    from gateway.config import is_placeholder

    assert is_placeholder(key)


@pytest.mark.parametrize("key", ["sk-proj-abcdefghijklmnop", "token-abc123", "mg-0123456789"])
def test_real_keys_are_keys(key: str) -> None:
    from gateway.config import is_placeholder

    assert not is_placeholder(key)
