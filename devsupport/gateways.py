"""A gateway in this process, on a real socket, configured for the fake upstream."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from devsupport.servers import ServerThread
from gateway.cli import protocol_options
from gateway.config import PASSTHROUGH_PATHS, Settings, parse_settings
from gateway.wiring import build_clients


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and key in out else value
    return out


def build_settings(upstream_url: str, redis_url: str, **overrides: Any) -> Settings:
    base = {
        "upstream": {
            "base_url": upstream_url,
            # Its /v1/messages speaks Anthropic's Messages API (``fake_anthropic``).
            "anthropic_base_url": upstream_url,
            "timeouts": {"first_byte_s": 5, "idle_s": 5},
            # The fake upstream's own routes, beside the OpenAI API's.
            "passthrough": [*PASSTHROUGH_PATHS, "echo/**", "redirect"],
        },
        "redis": {"url": redis_url},
        "memory": {"preset": "hybrid"},
        "summarizer": {"model": "fake-summarizer"},
    }
    return parse_settings(_merge(base, overrides), environ={})


def start_gateway(settings: Settings, clock: Callable[[], float] = time.time) -> ServerThread:
    """The gateway as ``serve`` runs it (its HTTP protocol and client bounds), in a thread;
    ``clock`` is the time it reads (a test's own steps it)."""
    clients = build_clients(settings, settings.redis.url, clock=clock)
    app = clients.create_app(settings)
    return ServerThread(app, on_stop=clients.aclose, **protocol_options(settings)).start()
