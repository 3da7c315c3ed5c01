"""The fake Anthropic upstream's prompt cache, kept as Anthropic's API keeps it.

A request is read as one run of blocks in Anthropic's cache order: ``tools``, then
``system``, then the ``messages``' content blocks (a string content is one text block).
A block marked with ``cache_control`` is a breakpoint (a top-level ``cache_control``
marks the last block): the prefix ending there (every
block up to and including it) is written to the cache, once it is at least
``min_tokens`` long. A later request reads the longest cached prefix that ends at one
of its breakpoints or at one of the ``LOOKBACK_BLOCKS`` blocks before each (Anthropic's
20-block lookback, which is how a conversation whose marker moves to its newest message
reads the prefix the previous turn wrote). Usage then splits the request's tokens as
Anthropic's does: ``cache_read_input_tokens`` (the prefix read),
``cache_creation_input_tokens`` (from there to the last breakpoint written) and
``input_tokens`` (the rest, after the last breakpoint).

A prefix is known by a hash of its exact content: each block's canonical JSON (sorted
keys, ``cache_control`` stripped at any depth) with its place (tool, system or a
message's role), after the model's name, as caches are per model. Consecutive messages
of one role hash as one (the API merges them). Caches are per ``x-api-key`` (Anthropic's
are per organization) and never expire (Anthropic's last 5 minutes or an hour).

Claude Code opens ``system`` with a block ``x-anthropic-billing-header: cc_version=…``
whose hash changes with every prompt; Anthropic reads it as a header, not as prompt, and
so does this cache: it is left out of every prefix (else no Claude Code call could read
a cache).

Tokens are counted approximately: a block is ``len(canonical JSON) // 4`` tokens, at
least 1 (``block_tokens``), no tokenizer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

# Anthropic's minimum cacheable prompt for its Sonnet and Opus models (Haiku's is
# larger): a shorter prefix is neither written nor read.
MIN_CACHEABLE_TOKENS = 1024
LOOKBACK_BLOCKS = 20
MAX_BREAKPOINTS = 4
BILLING_HEADER = "x-anthropic-billing-header:"


def stripped(value: Any) -> Any:
    """``value`` without any ``cache_control`` field, at any depth."""
    if isinstance(value, dict):
        return {k: stripped(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [stripped(v) for v in value]
    return value


def marks(value: Any) -> int:
    """How many blocks in ``value`` carry ``cache_control`` (nested ones too)."""
    if isinstance(value, dict):
        own = 1 if value.get("cache_control") is not None else 0
        return own + sum(marks(v) for k, v in value.items() if k != "cache_control")
    if isinstance(value, list):
        return sum(marks(v) for v in value)
    return 0


def canonical(value: Any) -> str:
    return json.dumps(stripped(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def block_tokens(block: Any) -> int:
    """The fake's token count of one block: a token every 4 characters of its canonical
    JSON, at least 1."""
    return max(1, len(canonical(block)) // 4)


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _is_billing_header(block: Any) -> bool:
    return isinstance(block, dict) and str(block.get("text", "")).startswith(BILLING_HEADER)


def cache_order(body: dict[str, Any]) -> list[tuple[str, Any]]:
    """The request's blocks in cache order, each with its place: ``tools``, ``system``,
    or the role of the message it is in."""
    placed: list[tuple[str, Any]] = [("tools", tool) for tool in body.get("tools") or ()]
    system = [b for b in _blocks(body.get("system")) if not _is_billing_header(b)]
    placed += [("system", block) for block in system]
    for message in body.get("messages") or ():
        placed += [(str(message.get("role")), b) for b in _blocks(message.get("content"))]
    return placed


@dataclass(frozen=True)
class Prefix:
    """The prefix that ends at one block: its hash and its length in tokens."""

    digest: str
    tokens: int
    breakpoint: bool  # the block that ends it carries cache_control
    ttl: str  # the breakpoint's ("5m" unless it says "1h")


def prefixes(body: dict[str, Any]) -> list[Prefix]:
    """The prefix ending at each of the request's blocks, in cache order."""
    running = hashlib.sha256(str(body.get("model")).encode())
    found, tokens = [], 0
    placed = cache_order(body)
    for at, (place, block) in enumerate(placed):
        running.update(f"{place}\n{canonical(block)}\n".encode())
        tokens += block_tokens(block)
        control = block.get("cache_control") if isinstance(block, dict) else None
        if at == len(placed) - 1 and body.get("cache_control") is not None:
            control = body["cache_control"]
        marked = marks(block) > 0 or control is not None
        ttl = control.get("ttl", "5m") if isinstance(control, dict) else "5m"
        found.append(Prefix(running.hexdigest(), tokens, marked, ttl))
    return found


@dataclass
class PromptCache:
    """The cached prefixes, per API key."""

    min_tokens: int = MIN_CACHEABLE_TOKENS
    written: dict[str, set[str]] = field(default_factory=dict)

    def clear(self) -> None:
        self.written.clear()

    def usage(self, api_key: str, body: dict[str, Any], *, write: bool = True) -> dict[str, Any]:
        """The request's input usage, as Anthropic reports it; its breakpoints' prefixes
        are written to the cache unless ``write`` is false (a token count writes none)."""
        ends = prefixes(body)
        total = ends[-1].tokens if ends else 0
        cached = self.written.setdefault(api_key, set())
        read = 0
        for at, end in enumerate(ends):
            if not end.breakpoint:
                continue
            for back in range(at, max(-1, at - LOOKBACK_BLOCKS), -1):
                if ends[back].digest in cached:
                    read = max(read, ends[back].tokens)
                    break
        writable = [e for e in ends if e.breakpoint and e.tokens >= self.min_tokens]
        created = max(0, writable[-1].tokens - read) if writable else 0
        if write:
            cached.update(e.digest for e in writable)
        one_hour = created if writable and writable[-1].ttl == "1h" else 0
        return {
            "input_tokens": total - read - created,
            "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": created - one_hour,
                "ephemeral_1h_input_tokens": one_hour,
            },
        }
