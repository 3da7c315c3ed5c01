"""The YAML configuration: pydantic models, `${VAR}` expansion and preset resolution.

Every key is validated at start-up; an unknown key or a wrong type stops the start with a
message that names the key path (``upstream.timeouts.connect_s: ...``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(Exception):
    """The configuration file cannot be used; the message names the offending key."""


class _Section(BaseModel):
    # Unknown keys are a typo more often than not: refuse them rather than ignore them.
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    require_session: bool = False
    tenant_secret: str | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"


class UpstreamTimeouts(_Section):
    connect_s: float = Field(default=5.0, gt=0)
    first_byte_s: float = Field(default=120.0, gt=0)
    idle_s: float = Field(default=60.0, gt=0)
    write_s: float = Field(default=30.0, gt=0)


class UpstreamConfig(_Section):
    base_url: str = "https://api.openai.com/v1"
    api_key: str | None = None
    timeouts: UpstreamTimeouts = UpstreamTimeouts()
    max_connections: int = Field(default=512, gt=0)
    max_keepalive_connections: int = Field(default=128, ge=0)

    @model_validator(mode="after")
    def _check_url(self) -> UpstreamConfig:
        if not re.match(r"^https?://[^/]+", self.base_url):
            raise ValueError("base_url must start with http:// or https://")
        return self


class RedisConfig(_Section):
    url: str = "embedded"
    data_dir: str = "./.memory-gateway"
    timeout_ms: int = Field(default=100, gt=0)
    on_failure: Literal["open", "closed"] = "open"
    retention_days: float = Field(default=30, gt=0)
    max_connections: int = Field(default=64, gt=0)

    @model_validator(mode="after")
    def _check_url(self) -> RedisConfig:
        if self.url != "embedded" and not re.match(r"^(rediss?|unix)://", self.url):
            raise ValueError("url must be 'embedded', redis://, rediss:// or unix://")
        return self


PresetName = Literal[
    "rolling-window", "recursive-summary", "rolling-summary", "progressive", "hybrid"
]

# The verbatim window each seed keeps (its other tiers are added by later releases).
PRESET_WINDOW_MESSAGES: dict[str, int] = {
    "rolling-window": 21,  # seed 000: the last 21 interactions
    "recursive-summary": 10,  # seed 001: the last 10 messages
    "rolling-summary": 6,  # seed 002: the last 3 turns
    "progressive": 40,  # seed 003: token-aware; the count is only an upper bound
    "hybrid": 8,  # seed 004: the last 8 messages
}
PRESET_WINDOW_TOKENS: dict[str, int | None] = {"progressive": 4000}


class MemoryConfig(_Section):
    preset: PresetName = "hybrid"
    budget_tokens: int = Field(default=3000, gt=0)
    window_messages: int | None = Field(default=None, gt=0)
    window_tokens: int | None = Field(default=None, gt=0)
    # How many stored messages one request loads to reconcile a resent history.
    reconcile_tail: int = Field(default=64, gt=0)
    memory_role: Literal["system", "developer"] = "system"

    @property
    def effective_window_messages(self) -> int:
        return self.window_messages or PRESET_WINDOW_MESSAGES[self.preset]

    @property
    def effective_window_tokens(self) -> int | None:
        return self.window_tokens or PRESET_WINDOW_TOKENS.get(self.preset)


class SummarizerConfig(_Section):
    model: str = "gpt-4o-mini"
    base_url: str | None = None
    api_key: str | None = None


class Settings(_Section):
    """The whole configuration file."""

    server: ServerConfig = ServerConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    redis: RedisConfig = RedisConfig()
    memory: MemoryConfig = MemoryConfig()
    summarizer: SummarizerConfig = SummarizerConfig()


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: Any, environ: dict[str, str], path: str = "") -> Any:
    """Replace ``${VAR}`` and ``${VAR:-default}`` in every string of a parsed YAML tree."""
    if isinstance(value, dict):
        return {
            k: expand_env(v, environ, f"{path}.{k}" if path else str(k)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [expand_env(v, environ, f"{path}.{i}") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{path}: environment variable {name} is not set")

    expanded = _VAR.sub(substitute, value)
    # A whole-value "${VAR}" that expands to "null"/"" means "not set", as YAML would read it.
    if expanded != value and _VAR.fullmatch(value) and expanded in ("", "null", "~"):
        return None
    return expanded


def _format_errors(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = "unknown key" if item["type"] == "extra_forbidden" else item["msg"]
        lines.append(f"{path}: {message}")
    return "; ".join(lines)


def parse_settings(data: Any, environ: dict[str, str] | None = None) -> Settings:
    """Validate an already-parsed YAML document."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("(top level): expected a mapping of sections")
    expanded = expand_env(data, dict(os.environ) if environ is None else environ)
    try:
        return Settings.model_validate(expanded)
    except ValidationError as error:
        raise ConfigError(_format_errors(error)) from None


def load_settings(path: str | Path, environ: dict[str, str] | None = None) -> Settings:
    """Read, expand and validate a YAML configuration file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    return parse_settings(data, environ)
