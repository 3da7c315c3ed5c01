"""The YAML configuration: pydantic models, `${VAR}` expansion and preset resolution
(the memory tiers and the named presets are in ``presets``).

Every key is validated at start-up; an unknown key or a wrong type stops the start with a
message that names the key path (``upstream.timeouts.connect_s: ...``).
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    model_validator,
)

from gateway.presets import PRESETS, Composition, PresetName, StableLayout


class ConfigError(Exception):
    """The configuration file cannot be used; the message names the offending key."""


class _Section(BaseModel):
    # Unknown keys are a typo more often than not: refuse them rather than ignore them.
    model_config = ConfigDict(extra="forbid", frozen=True)


class CorsConfig(_Section):
    """server.cors: browser apps calling the gateway from other origins.

    No origins (the default): no CORS headers at all. With origins, the gateway answers
    a preflight OPTIONS itself (never the upstream) and names an allowed origin on its
    answers, exposing the X-Memory-* headers to the page's script.
    """

    # Exact origins ("https://app.example.com"), or ["*"] for any (not with credentials).
    allow_origins: list[str] = []
    allow_methods: list[str] = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    # "*": whatever headers the preflight asks for (the SDKs send their own x-stainless-*).
    allow_headers: list[str] = ["*"]
    # Cookies and HTTP auth; an API key in an Authorization header set by script does
    # not need them.
    allow_credentials: bool = False
    expose_headers: list[str] = [
        "X-Memory-Status", "X-Memory-Receipt", "X-Memory-Context-Tokens", "X-Session-Id",
        "X-Gateway-Request-Id", "Retry-After",
    ]  # fmt: skip
    max_age_s: int = Field(default=600, ge=0)

    @model_validator(mode="after")
    def _check_origins(self) -> CorsConfig:
        if "*" in self.allow_origins and self.allow_credentials:
            # Any site could then act with the user's cookies: name the origins instead.
            raise ValueError('allow_origins "*" cannot go with allow_credentials: true')
        for origin in self.allow_origins:
            if origin != "*" and not re.match(r"^https?://[^/]+$", origin):
                raise ValueError(f"allow_origins: {origin!r} is not an origin (scheme://host)")
        return self


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # Sized for images (the OpenAI API takes tens of MB: a 20 MB image is ~27 MB of
    # base64); what memory keeps of a message is capped below (max_message_bytes).
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    # The request line and headers together. The HTTP parser holds them in memory before
    # the gateway sees them, so the limit has to be the parser's (see cli.serve).
    max_header_bytes: int = Field(default=64 * 1024, ge=4096)
    # Caps below max_body_bytes: the messages of one request (any API, the memory API's
    # import and context) and one message's text, in UTF-8 bytes. Tokenizing and indexing
    # cost grows faster than a text's length: no single huge message or 100,000 tiny ones.
    max_messages: int = Field(default=2048, gt=0)
    max_message_bytes: int = Field(default=1024 * 1024, gt=0)
    # One image part's bytes (decoded), apart from max_message_bytes (which counts text):
    # the OpenAI API's own per-image limit.
    max_media_bytes: int = Field(default=20 * 1024 * 1024, gt=0)
    require_session: bool = False
    tenant_secret: str | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # "json": one JSON object a line (uvicorn's lines too); "text": plain lines.
    log_format: Literal["json", "text"] = "json"
    # One line per HTTP request on the gateway.access logger (INFO), instead of uvicorn's.
    access_log: bool = True
    # GET /metrics (Prometheus text). Labels never carry tenants, sessions or content;
    # a token, when set, is required as "Authorization: Bearer <token>".
    metrics: bool = True
    metrics_token: str | None = None
    mcp: bool = True  # the MCP server at /mcp (docs/mcp.md): the memory API's keys and tools
    # Proxies (addresses or networks) whose X-Forwarded-For / X-Forwarded-Proto name the
    # client; none by default: a client's address is its socket's.
    trusted_proxies: list[str] = []
    # User ids on log lines at INFO: a short keyed hash (lines of one user still group).
    log_user_ids: Literal["hash", "plain"] = "hash"
    # How long a client may hold a connection without doing its part (http/server.py): a
    # request's line and headers must arrive within header_timeout_s of the connection
    # (or of their first byte), its body within body_timeout_s of them (else 408 and the
    # connection closed); a kept-alive connection idle for keepalive_s is closed; a
    # client that reads none of its answer for client_write_timeout_s is cut off (and
    # its upstream stream closed). Slow or idle sockets would otherwise be held forever.
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=60.0, gt=0)
    keepalive_s: float = Field(default=5.0, gt=0)
    client_write_timeout_s: float = Field(default=30.0, gt=0)
    # A client with bytes of its answer waiting must take at least this many a second of
    # them, looked at every client_write_timeout_s (http/slow_readers.py): a trickling
    # reader never fills the send buffer the write deadline waits for. 0: not checked.
    client_min_read_bytes_s: int = Field(default=1024, ge=0)
    # Connections one client address may hold open at once (IPv6: one /64), per process;
    # past it a new one gets 429 and is closed. 0: no cap. trusted_proxies are exempt.
    max_connections_per_client: int = Field(default=256, ge=0)
    cors: CorsConfig = CorsConfig()  # cross-origin browser requests


class UpstreamTimeouts(_Section):
    connect_s: float = Field(default=5.0, gt=0)
    first_byte_s: float = Field(default=120.0, gt=0)
    idle_s: float = Field(default=60.0, gt=0)
    write_s: float = Field(default=30.0, gt=0)
    # Waiting for a free pooled connection when all max_connections are busy: past it a
    # 503 upstream_pool_full at once (not a 504 after connect_s): clients back off.
    pool_s: float = Field(default=2.0, gt=0)


# The OpenAI API's public endpoints (under /v1/): what the passthrough forwards unless
# the config names others. "*" is one path segment, "**" any number of them.
PASSTHROUGH_PATHS = (
    "models", "models/*", "embeddings", "completions", "moderations",
    "chat/completions/**", "responses", "responses/**", "images/**", "audio/**",
    "files", "files/**", "uploads", "uploads/**", "batches", "batches/**",
    "fine_tuning/**", "vector_stores", "vector_stores/**", "assistants", "assistants/**",
    "threads", "threads/**", "realtime/**", "evals", "evals/**", "containers",
    "containers/**", "conversations", "conversations/**",
)  # fmt: skip


# What a gateway key may reach by default (auth.mode: keys): the stateless endpoints
# only. Files, batches, stored completions, responses, threads, vector stores, fine-tuning
# jobs… belong to the upstream account, which every tenant of an operator key shares.
STATELESS_PATHS = (
    "models", "models/*", "embeddings", "completions", "moderations",
    "images/generations", "images/edits", "images/variations",
    "audio/speech", "audio/transcriptions", "audio/translations",
)  # fmt: skip


class PromptCacheConfig(_Section):
    """How the upstream caches a repeated prompt prefix (``upstream.prompt_cache``): each
    turn's receipt says how many of its tokens it could reuse (``stable=N``).

    openai: from ``minimum_tokens`` common tokens, in steps of ``step_tokens`` (OpenAI's
    automatic caching; Anthropic's and others' with their own numbers); prefix: the whole
    common prefix (vLLM's automatic prefix caching, llama.cpp's prompt cache); none."""

    policy: Literal["openai", "prefix", "none"] = "openai"
    minimum_tokens: int = Field(default=1024, gt=0)
    step_tokens: int = Field(default=128, gt=0)


class UpstreamConfig(_Section):
    base_url: str = "https://api.openai.com/v1"
    api_key: str | None = None
    # /v1/* paths passed upstream as they are (others: 405). None: the OpenAI API's public
    # ones (PASSTHROUGH_PATHS), with gateway keys the stateless ones (STATELESS_PATHS).
    passthrough: list[str] | None = None

    def passthrough_paths(self, gateway_keys: bool) -> list[str]:
        if self.passthrough is not None:
            return self.passthrough
        return list(STATELESS_PATHS if gateway_keys else PASSTHROUGH_PATHS)

    # Client request headers forwarded besides the built-in allowlist (what the OpenAI
    # SDKs send: upstream/headers.py): names, or prefixes ending in "*".
    forward_headers: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9!#$%&'+.^_`|~-]+\*?$")]] = []

    timeouts: UpstreamTimeouts = UpstreamTimeouts()
    # The pool: at most this many connections open at once (waiting for one is bounded
    # by timeouts.pool_s), an idle one closed after keepalive_s.
    max_connections: int = Field(default=512, gt=0)
    # One tenant's share of the pool in one process: past it, a tenant's request is
    # refused (429) while no more than a share of the pool is free (http.upstream_share).
    # 1: a tenant may take the whole pool.
    tenant_share: float = Field(default=0.25, gt=0, le=1)
    keepalive_s: float = Field(default=15.0, gt=0)
    # The most one answer may hold, counted decoded (gzip/deflate
    # undone) where the gateway reads it, raw where it only relays it. Past it the answer
    # ends with an error (in-band for a stream) and nothing is recorded: a 100 MB answer
    # or a gzip bomb would otherwise be held in memory whole.
    max_response_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    # The most one forwarded chat body may hold (docs/images.md): when the images of the
    # window would make it larger, the oldest are sent as placeholders until it fits.
    # As large as server.max_body_bytes: whatever a client may send can be forwarded.
    max_request_bytes: int = Field(default=32 * 1024 * 1024, ge=1024 * 1024)
    prompt_cache: PromptCacheConfig = PromptCacheConfig()
    # /v1/responses: the upstream's own, the gateway's over chat completions, or auto:
    # native until the upstream answers 404/405 there (routes/over_chat).
    responses: Literal["native", "chat", "auto"] = "auto"
    # POST /v1/messages (Anthropic's Messages API, docs/anthropic.md) goes to this server,
    # with this key as x-api-key (with gateway keys; else the client's own key).
    anthropic_base_url: str = "https://api.anthropic.com/v1"
    anthropic_api_key: str | None = None

    @model_validator(mode="after")
    def _check_url(self) -> UpstreamConfig:
        for name in ("base_url", "anthropic_base_url"):
            if not re.match(r"^https?://[^/]+", getattr(self, name)):
                raise ValueError(f"{name} must start with http:// or https://")
        return self


class RedisConfig(_Section):
    url: str = "embedded"
    # url names one node (any) of a Redis Cluster; "redis+cluster://…" says the same.
    cluster: bool = False
    data_dir: str = "./.memory-gateway"
    timeout_ms: int = Field(default=100, gt=0)
    on_failure: Literal["open", "closed"] = "open"
    retention_days: float = Field(default=30, gt=0)
    max_connections: int = Field(default=64, gt=0)
    # How long a turn's record is tried again while Redis is unavailable (a restart, a
    # failover) before the answer is reported not stored; a stream's [DONE] waits for it.
    record_retry_s: float = Field(default=2.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _cluster_scheme(cls, data: Any) -> Any:
        url = data.get("url") if isinstance(data, dict) else None
        if isinstance(url, str) and re.match(r"^rediss?\+cluster://", url):
            return {**data, "url": url.replace("+cluster", "", 1), "cluster": True}
        return data

    @model_validator(mode="after")
    def _check_url(self) -> RedisConfig:
        if self.url != "embedded" and not re.match(r"^(rediss?|unix)://", self.url):
            raise ValueError(
                "url must be 'embedded', redis://, rediss://, unix:// or redis+cluster://"
            )
        if self.cluster and not re.match(r"^rediss?://", self.url):
            raise ValueError("a Redis Cluster is reached by redis:// or rediss://, one node's")
        return self


class MemoryConfig(_Section):
    # The composition that wins bench/recall.py at the default budget (docs/benchmarks.md).
    preset: PresetName = "hybrid-recall"
    budget_tokens: int = Field(default=3000, gt=0)
    # A custom composition replaces the preset's tiers entirely.
    tiers: Composition | None = None
    window_messages: int | None = Field(default=None, gt=0)  # overrides the window's count
    window_tokens: int | None = Field(default=None, gt=0)  # overrides the window's tokens
    # The cache-stable layout (docs/prompt-caching.md): None keeps the preset's; false
    # rebuilds the memory message every turn, true gives the preset the layout's
    # defaults, a mapping its own shares ({recall_share: 0.3, …}).
    stable_layout: StrictBool | StableLayout | None = None
    # How many stored messages one request loads to reconcile a resent history.
    reconcile_tail: int = Field(default=64, gt=0)
    # The role of the injected memory message. user: a leading user-role message, for an
    # operator who wants no text with system authority but the client's own.
    memory_role: Literal["system", "developer", "user"] = "system"
    # Receipts of the last recorded turns kept per session (the inspector's recent
    # requests, ``GET …/receipts``): a few hundred bytes each; 0 keeps none.
    receipts: int = Field(default=10, ge=0, le=100)
    # The sessions' archives a process keeps in memory for recall (``memory.archive``),
    # least recently used out first: about 0.75 KB a message.
    archive_cache_mb: int = Field(default=256, gt=0)
    # Images of messages (docs/images.md): "store" keeps each once per session by its
    # hash and sends it again while its message is in the window; "drop" keeps only a
    # placeholder (the image is sent with its own turn only).
    media: Literal["store", "drop"] = "store"
    # The most text (UTF-8 bytes) one request may add to a session's log: one Redis
    # script writes a turn, and Redis runs nothing else meanwhile (~30 MB held every other
    # tenant's calls past their deadline). A first request carrying a longer history is
    # refused (413); the memory API's import writes any history in batches of this size.
    max_record_bytes: int = Field(default=4 * 1024 * 1024, gt=0)

    @property
    def composition(self) -> Composition:
        base = self.tiers or PRESETS[self.preset]
        window = base.window
        if self.window_messages is not None:
            window = window.model_copy(update={"messages": self.window_messages})
        if self.window_tokens is not None:
            window = window.model_copy(update={"tokens": self.window_tokens})
        update: dict[str, object] = {"window": window}
        stable = base.stable
        if isinstance(self.stable_layout, StableLayout):
            stable = self.stable_layout
        elif self.stable_layout is False:
            stable = None
        elif self.stable_layout and stable is None:
            stable = StableLayout()
        if stable is not None and self.window_messages is not None:
            # The layout counts its window itself: the override is its count too.
            stable = stable.model_copy(update={"window_messages": self.window_messages})
        update["stable"] = stable
        return base.model_copy(update=update)


class SummarizerConfig(_Section):
    model: str | None = "gpt-4o-mini"  # null: no model, every summary a model-free extract
    base_url: str | None = None  # None: the upstream's base_url
    api_key: str | None = None  # None: upstream.api_key; never a client's key
    timeout_s: float = Field(default=30.0, gt=0)
    temperature: float = Field(default=0.2, ge=0, le=2)


class WorkerConfig(_Section):
    """Background summarization jobs."""

    in_process: bool = True  # false: run `memory-gateway worker` processes instead
    concurrency: int = Field(default=4, gt=0)
    block_ms: int = Field(default=1000, gt=0)
    reclaim_idle_s: float = Field(default=60, gt=0)  # a crashed consumer's jobs are taken over
    redis_timeout_s: float = Field(default=5.0, gt=0)  # the worker is off the request path
    # Notices spread over this many streams (a cluster: its masters); change with none pending.
    job_shards: int = Field(default=4, gt=0, le=1024)
    # A job that fails runs again after retry_backoff_s (doubling); its last attempt drops it.
    job_attempts: int = Field(default=3, gt=0)
    retry_backoff_s: float = Field(default=5.0, gt=0)
    yield_max_s: float = Field(default=0.25, ge=0)  # in-process: requests first (activity.py)


# What local servers and their clients send when there is no key: never a tenant.
PLACEHOLDER_KEYS = (
    "", "empty", "none", "null", "nokey", "no-key", "sk-no-key-required", "ollama",
    "lm-studio", "lmstudio", "not-needed", "not_needed", "dummy", "sk-dummy", "sk-xxx",
    "key", "token", "test", "sk-test", "placeholder", "changeme", "fake", "sk-fake",
    "anything", "x", "-", "bearer", "undefined", "your_api_key", "your-api-key",
    "yourapikey", "api_key", "api-key", "apikey", "sk-xxxx", "sk-1234", "sk-...", "sk-",
    "vllm", "llama", "llamacpp", "llama.cpp", "local", "localai", "openai", "secret",
)  # fmt: skip
# Shorter keys are refused too: no provider issues one, and every short default is one.
MIN_KEY_CHARS = 8


def is_placeholder(key: str) -> bool:
    """Whether a key is no key: empty, a well-known stand-in (in any case or width, with
    "Bearer " repeated before it), or too short to be anyone's."""
    normal = unicodedata.normalize("NFKC", key).strip().casefold()
    while normal.startswith("bearer") and normal[6:7] in (" ", "\t", ""):
        normal = normal[6:].strip()
    return normal in PLACEHOLDER_KEYS or len(normal) < MIN_KEY_CHARS


class RateLimit(_Section):
    """Limits on one tenant's or one key's use, counted in Redis so that every replica
    enforces the same numbers. 0: no limit."""

    requests_per_minute: int = Field(default=0, ge=0)
    # Prompt tokens forwarded plus completion tokens: the prompt's reserved before it is
    # forwarded (refused when it would pass the minute's budget), settled to the
    # upstream's usage once the answer is over.
    tokens_per_minute: int = Field(default=0, ge=0)
    concurrent: int = Field(default=0, ge=0)  # requests in flight at once

    def over(self, override: RateLimit | None) -> RateLimit:
        """These limits with the fields an override sets (its unset ones keep these)."""
        if override is None:
            return self
        return self.model_copy(update={f: getattr(override, f) for f in override.model_fields_set})


class LimitsConfig(_Section):
    """Per-tenant and per-key request, token and concurrency limits (``limits:``), kept in
    Redis. Off by default: every number 0."""

    tenant: RateLimit = RateLimit()  # each tenant (forward mode: each client key)
    key: RateLimit = RateLimit()  # each gateway key (auth.mode keys)
    # auth.mode keys: a named tenant's own limits, over ``tenant``'s.
    tenants: dict[str, RateLimit] = {}
    # Each client address (IPv6: its /64), whatever key it uses, in both auth modes: the
    # bound on a client that rotates keys (in forward mode each key is a fresh tenant).
    # server.trusted_proxies are exempt (their requests carry many clients).
    address: RateLimit = RateLimit()
    # How long a request counts as in flight at most: a crashed process's requests stop
    # counting after this; a longer stream stops counting too.
    lease_s: float = Field(default=600.0, gt=0)


class GatewayKey(_Section):
    """A key the gateway issues (``auth.mode: keys``): who holds it may use the gateway as
    ``tenant``, for the user ids in ``users`` ("*": any)."""

    key: str = Field(min_length=16)  # the secret itself, usually ${ENV}
    tenant: str = Field(min_length=1, max_length=128)
    users: list[str] | Literal["*"] = "*"
    # The upstream key its requests use: a name in auth.upstream_keys (else upstream.api_key).
    upstream_key: str | None = None
    # Stored megabytes of its tenant: None (unset) takes auth.quota_mb; 0, no bound.
    quota_mb: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    name: str | None = Field(default=None, max_length=128)
    # This key's own rate limits, over limits.key.
    limits: RateLimit | None = None


class AuthConfig(_Section):
    """Who may use the gateway (docs/operations.md, "Security")."""

    # forward: each client's own key goes upstream and names its tenant; keys: the gateway
    # issues keys (listed here or made through /admin/keys) and holds the upstream keys.
    mode: Literal["forward", "keys"] = "forward"
    # forward: a missing or placeholder key ("EMPTY", "ollama", …) is refused unless true
    # (then every such client shares one anonymous tenant).
    allow_anonymous: bool = False
    # forward: the memory API serves a key once the upstream accepted it (GET /models, or
    # a chat answer), for this long; a key revoked upstream loses access after it.
    verify_s: float = Field(default=300.0, gt=0)
    # forward: X-User-Id is taken as given (any client of a tenant may name any user);
    # false ignores it, which turns cross-session memory off.
    trust_user_header: bool = True
    keys: list[GatewayKey] = []
    # Named upstream keys the gateway's keys may use (upstream_key: <name>).
    upstream_keys: dict[str, str] = {}
    # The admin API (/admin/keys): create, list and revoke keys. None: no admin API.
    admin_key: str | None = Field(default=None, min_length=16)
    # How often each process checks for keys made or revoked through the admin API.
    refresh_s: float = Field(default=0.25, gt=0, le=5)
    # Wrong admin keys per client address in admin_window_s, then 429 (per process).
    admin_attempts: int = Field(default=10, gt=0)
    admin_window_s: float = Field(default=300, gt=0)
    # A process that could not read the admin API's keys for this long stops taking them
    # (503) rather than honour a key revoked meanwhile; keys of this file still work.
    stale_after_s: float = Field(default=5.0, gt=0)
    # Stored megabytes per tenant, of every tenant whose key names none (forward mode:
    # every tenant); past it 429. 0 or null: no bound.
    quota_mb: float | None = Field(default=1024.0, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _check(self) -> AuthConfig:
        for key in self.keys:
            if key.upstream_key is not None and key.upstream_key not in self.upstream_keys:
                raise ValueError(f"upstream_key {key.upstream_key!r} is not in upstream_keys")
            if is_placeholder(key.key):
                raise ValueError("a gateway key must not be a placeholder")
        if len({k.key for k in self.keys}) != len(self.keys):
            raise ValueError("keys: the same key is listed twice")
        if self.mode == "keys" and not self.keys and self.admin_key is None:
            raise ValueError("mode keys needs keys, or an admin_key to create them")
        return self


class UIConfig(_Section):
    """The inspector page at /ui: off unless enabled, and then only with an admin key."""

    enabled: bool = False
    # The operator's key: it sees every tenant's sessions. Never a tenant's API key.
    admin_key: str | None = Field(default=None, min_length=16)
    session_s: float = Field(default=8 * 3600, gt=0)  # a login lasts this long
    # Secure cookies: None (when the request came over https), or always / never (true
    # behind a proxy that ends TLS).
    secure_cookies: bool | None = None
    # Failed logins per client address within login_window_s, then 429 (never the right key).
    login_attempts: int = Field(default=10, gt=0)
    login_window_s: float = Field(default=300, gt=0)

    @model_validator(mode="after")
    def _key_when_enabled(self) -> UIConfig:
        if self.enabled and not self.admin_key:
            raise ValueError("ui.admin_key must be set (16 characters or more) to enable /ui")
        return self


class ModelLimits(_Section):
    """One ``models:`` entry: what a model can take, so
    that a request's budget is never more than its window minus room for the answer."""

    match: str = Field(min_length=1)  # a model name or glob pattern (fnmatch, any case)
    context_tokens: int = Field(gt=0)  # the model's context window
    # Kept free for the answer; None: the request's max_tokens, else min(512, window / 4).
    output_reserve_tokens: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _room_left(self) -> ModelLimits:
        if self.output_reserve_tokens is not None and (
            self.output_reserve_tokens >= self.context_tokens
        ):
            raise ValueError("output_reserve_tokens must be less than context_tokens")
        return self


class Settings(_Section):
    """The whole configuration file."""

    server: ServerConfig = ServerConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    redis: RedisConfig = RedisConfig()
    memory: MemoryConfig = MemoryConfig()
    summarizer: SummarizerConfig = SummarizerConfig()
    worker: WorkerConfig = WorkerConfig()
    ui: UIConfig = UIConfig()
    auth: AuthConfig = AuthConfig()
    limits: LimitsConfig = LimitsConfig()  # rate limits
    # Models' context windows, first match wins: none known by default.
    models: list[ModelLimits] = []

    @model_validator(mode="after")
    def _operator_key_needs_gateway_keys(self) -> Settings:
        # The operator's upstream key serves only callers the gateway itself knows: in
        # forward mode any caller would be served on it.
        if self.upstream.api_key is not None and self.auth.mode != "keys":
            raise ValueError(
                "upstream.api_key is used only with auth.mode: keys (the gateway's own keys); "
                "in forward mode each client's key goes upstream"
            )
        return self


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


# Errors that only say the value is not of one of a union's kinds (``true`` or a mapping):
# noise beside another kind's error about the same key.
_WRONG_KIND = frozenset(
    {"bool_type", "bool_parsing", "model_type", "dict_type", "model_attributes_type"}
)


def _key_path(loc: tuple[int | str, ...]) -> str:
    """A setting's dotted path, without pydantic's names for a union's kinds ("bool",
    "function-after[…]", a class name): keys are lower_snake_case."""
    keys = [str(part) for part in loc]
    kept = [k for k in keys if not (k[:1].isupper() or "[" in k or k in ("bool", "int", "str"))]
    return ".".join(kept)


def _format_errors(error: ValidationError) -> str:
    items = [(_key_path(item["loc"]), item) for item in error.errors()]
    lines = []
    for path, item in items:
        if item["type"] in _WRONG_KIND and any(
            other[0].startswith(path) and other[1]["type"] not in _WRONG_KIND for other in items
        ):
            continue
        message = "unknown key" if item["type"] == "extra_forbidden" else item["msg"]
        line = f"{path or '(top level)'}: {message}"
        if line not in lines:
            lines.append(line)
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
