"""Which headers cross the proxy (pure).

A client's request reaches the upstream with the headers on an allowlist only: those an
OpenAI-compatible server reads (what the OpenAI SDKs send), and the ones the operator
adds (``upstream.forward_headers``). A denylist let through whatever it did not name: an
Azure- or Anthropic-style key, a cookie, what earlier proxies said of the client, beside
the operator's key. LiteLLM's proxy forwards client headers the same way (an allowlist).

Answers come back with every header but the hop-by-hop ones (RFC 9110 §7.6.1, plus those a
Connection header names), which describe one connection and never cross.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
GATEWAY_REQUEST_HEADERS = frozenset({"x-session-id", "x-user-id", "x-memory-mode"})
# Which upstream account a request bills and sees: the client's to choose only with its
# own key, never with the operator's.
ACCOUNT_HEADERS = frozenset({"openai-organization", "openai-project"})
# What an OpenAI-compatible server reads of a client's request, whoever's key it carries.
# Content-Encoding describes a body the gateway relays as sent (never one it rewrote).
FORWARDED_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "content-encoding",
        "content-type",
        "user-agent",
        "openai-beta",  # the Assistants, Realtime... betas
        "idempotency-key",
        "x-client-request-id",  # the client's id for its request, in OpenAI's logs
        # Anthropic's Messages API: which version and betas of it the client speaks.
        "anthropic-version",
        "anthropic-beta",
        "anthropic-dangerous-direct-browser-access",
    }
)
# The Stainless-made SDKs' (OpenAI's Python and Node ones) description of themselves and
# of a retry (X-Stainless-Lang, -OS, -Runtime-Version, -Retry-Count, -Timeout...): what the
# upstream would get with no gateway in between; no credential, no address.
FORWARDED_PREFIXES = ("x-stainless-",)
# Headers the gateway writes itself, or that only name the request's path to it: never
# forwarded, whatever the configuration says (``upstream.forward_headers``).
MANAGED_HEADERS = (
    HOP_BY_HOP
    | GATEWAY_REQUEST_HEADERS
    | ACCOUNT_HEADERS
    | {"authorization", "x-api-key", "host", "content-length"}
)
# Our own server writes these on every response: relayed too, a response had two of each.
SERVER_RESPONSE_HEADERS = frozenset({"date", "server"})


@dataclass(frozen=True)
class Allowlist:
    """Names (lower-case) and name prefixes of the client's headers that go upstream."""

    names: frozenset[str] = FORWARDED_HEADERS
    prefixes: tuple[str, ...] = FORWARDED_PREFIXES

    @classmethod
    def extended(cls, extra: Iterable[str]) -> Allowlist:
        """The built-in allowlist and ``extra``: names, or prefixes ending in ``*`` (a
        managed name among them is said at start-up, and stays the gateway's)."""
        names, prefixes = set(FORWARDED_HEADERS), list(FORWARDED_PREFIXES)
        for entry in extra:
            entry = entry.strip().lower()
            if entry in MANAGED_HEADERS:
                log.warning("upstream.forward_headers: %s is the gateway's own to send", entry)
            elif entry.endswith("*"):
                prefixes.append(entry[:-1])
            else:
                names.add(entry)
        return cls(frozenset(names), tuple(prefixes))

    def allows(self, name: str) -> bool:
        """Whether the header ``name`` (lower-case) may cross; never a managed one."""
        if name in self.names:
            return True
        return name not in MANAGED_HEADERS and name.startswith(self.prefixes)


BUILT_IN = Allowlist()


def _connection_tokens(headers: Iterable[tuple[str, str]]) -> set[str]:
    named: set[str] = set()
    for name, value in headers:
        if name.lower() == "connection":
            named.update(token.strip().lower() for token in value.split(",") if token.strip())
    return named


def request_headers(
    headers: Iterable[tuple[str, str]],
    *,
    api_key: str | None,
    rewritten: bool,
    allowlist: Allowlist = BUILT_IN,
    key_header: str = "authorization",
) -> list[tuple[str, str]]:
    """Headers to send upstream for a client's request: those on ``allowlist``, then the key.

    ``api_key``: the key sent in the client's stead ("": none at all; None: the client's
    own Authorization, and its choice of account, as it sent them). ``rewritten``: the
    body is the gateway's (a memory turn), whose answer is read to be recorded: the
    client's Content-Encoding does not describe it, and the answer is asked uncompressed.
    ``key_header``: where the upstream reads a key: ``authorization`` (Bearer), or
    ``x-api-key`` (Anthropic's API: ``_with_api_key``).
    """
    headers = list(headers)
    drop = _connection_tokens(headers)  # hop-by-hop, even when allowed
    if rewritten:
        drop |= {"accept-encoding", "content-encoding"}
    # The client's own key: its Authorization and its choice of account go as it sent them.
    # (OpenAI's account headers name nothing at an upstream that reads x-api-key.)
    accounts = ACCOUNT_HEADERS if key_header == "authorization" else frozenset()
    own = {"authorization"} | accounts if api_key is None else frozenset()
    out = []
    for name, value in headers:
        lower = name.lower()
        if lower not in drop and (allowlist.allows(lower) or lower in own):
            out.append((name, value))
    if key_header == "x-api-key":
        out = _with_api_key(out, headers, api_key)
    elif api_key:
        out.append(("authorization", f"Bearer {api_key}"))
    if rewritten:
        # We must read the answer to record it: ask for it uncompressed.
        out.append(("accept-encoding", "identity"))
    return out


def _with_api_key(
    sent: list[tuple[str, str]], received: list[tuple[str, str]], api_key: str | None
) -> list[tuple[str, str]]:
    """The headers for an upstream that reads ``x-api-key`` (Anthropic's): ``api_key``
    there; or, the client's own key (None), in the header the client sent it in (an API
    key as ``x-api-key``, an OAuth token as ``Authorization: Bearer``)."""
    own = [value for name, value in received if name.lower() == "x-api-key"]
    if api_key is None and not own:
        return sent
    kept = [(name, value) for name, value in sent if name.lower() != "authorization"]
    key = own[0] if api_key is None else api_key
    return [*kept, ("x-api-key", key)] if key else kept


def response_headers(headers: Iterable[tuple[str, str]], *, decoded: bool) -> list[tuple[str, str]]:
    """Headers to return to the client for an upstream response.

    ``decoded``: the body is sent as the gateway decoded it (content-encoding undone), so
    the upstream's length and encoding no longer describe it.
    """
    headers = list(headers)
    drop = HOP_BY_HOP | SERVER_RESPONSE_HEADERS | _connection_tokens(headers)
    if decoded:
        drop |= {"content-length", "content-encoding"}
    return [(name, value) for name, value in headers if name.lower() not in drop]


def media_type(headers: Iterable[tuple[str, str]]) -> str | None:
    """The Content-Type without its parameters, lower-cased; None when there is none."""
    for name, value in headers:
        if name.lower() == "content-type":
            return value.split(";", 1)[0].strip().lower()
    return None
