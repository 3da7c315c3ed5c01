"""Which headers cross the proxy (pure).

Hop-by-hop headers (RFC 9110 §7.6.1, plus those a Connection header names) describe one
connection and never cross. Length and encoding are recomputed by our own server. The
gateway's own request headers are removed before a memory request goes upstream.
"""

from __future__ import annotations

from collections.abc import Iterable

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
# The client's other credentials: they go nowhere when the gateway sends its own key (or
# none): an Azure- or Anthropic-style key, a cookie.
CREDENTIAL_HEADERS = frozenset({"api-key", "x-api-key", "cookie"})
# What earlier proxies said of the client: the client's own word, to nobody's use
# upstream (the gateway is the upstream's client), and its address is the client's data.
FORWARDING_HEADERS = frozenset(
    {"forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-real-ip"}
)
# Our own server writes these on every response: relayed too, a response had two of each.
SERVER_RESPONSE_HEADERS = frozenset({"date", "server"})


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
    strip_gateway_headers: bool,
    identity_encoding: bool,
) -> list[tuple[str, str]]:
    """Headers to send upstream for a client's request. ``api_key``: the key sent in the
    client's stead ("": none at all; None: the client's own, as it sent it)."""
    headers = list(headers)
    drop = HOP_BY_HOP | FORWARDING_HEADERS | _connection_tokens(headers)
    drop |= {"host", "content-length"}
    if strip_gateway_headers:
        drop |= GATEWAY_REQUEST_HEADERS
    if api_key is not None:
        drop |= {"authorization"} | ACCOUNT_HEADERS | CREDENTIAL_HEADERS
    if identity_encoding:
        # We must read the answer to record it: ask for it uncompressed.
        drop |= {"accept-encoding"}
    out = [(name, value) for name, value in headers if name.lower() not in drop]
    if api_key:
        out.append(("authorization", f"Bearer {api_key}"))
    if identity_encoding:
        out.append(("accept-encoding", "identity"))
    return out


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
