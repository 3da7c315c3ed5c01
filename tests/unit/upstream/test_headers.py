"""Which headers cross the proxy, in each direction."""

from __future__ import annotations

import pytest

from gateway import config
from gateway.upstream.headers import (
    FORWARDED_HEADERS,
    GATEWAY_REQUEST_HEADERS,
    HOP_BY_HOP,
    MANAGED_HEADERS,
    Allowlist,
    request_headers,
    response_headers,
)

Headers = list[tuple[str, str]]


def names(headers: Headers) -> list[str]:
    return [name.lower() for name, _ in headers]


def req(
    headers: Headers,
    *,
    api_key: str | None = None,
    rewritten: bool = False,
    allowlist: Allowlist | None = None,
) -> Headers:
    return request_headers(
        headers, api_key=api_key, rewritten=rewritten, allowlist=allowlist or Allowlist()
    )


# What the OpenAI Python SDK sends on a chat completion (openai 1.x), less its key.
SDK = [
    ("Accept", "application/json"),
    ("Accept-Encoding", "gzip, deflate"),
    ("Content-Type", "application/json"),
    ("User-Agent", "OpenAI/Python 1.99.0"),
    ("X-Stainless-Lang", "python"),
    ("X-Stainless-Package-Version", "1.99.0"),
    ("X-Stainless-OS", "Linux"),
    ("X-Stainless-Arch", "x64"),
    ("X-Stainless-Runtime", "CPython"),
    ("X-Stainless-Runtime-Version", "3.12.3"),
    ("X-Stainless-Async", "false"),
    ("X-Stainless-Retry-Count", "0"),
    ("X-Stainless-Read-Timeout", "600"),
    ("OpenAI-Beta", "assistants=v2"),
    ("Idempotency-Key", "stainless-python-retry-1"),
    ("X-Client-Request-Id", "req-1"),
]
# What must never reach the upstream from a client, whoever's key goes.
NEVER = [
    ("api-key", "azure-key"),
    ("X-Api-Key", "anthropic-key"),
    ("Cookie", "session=1"),
    ("Forwarded", "for=10.0.0.1"),
    ("X-Forwarded-For", "10.0.0.1"),
    ("X-Forwarded-Host", "internal"),
    ("X-Forwarded-Proto", "http"),
    ("X-Real-IP", "10.0.0.1"),
    ("Origin", "https://evil.example"),
    ("Referer", "https://app.example/secret-page"),
    ("X-Session-Id", "s1"),
    ("X-User-Id", "u1"),
    ("X-Memory-Mode", "off"),
    ("X-Custom", "anything"),
    ("Host", "gateway:8080"),
    ("Content-Length", "12"),
    ("Expect", "100-continue"),
]


def test_what_the_sdks_send_goes_the_rest_does_not() -> None:
    assert req(NEVER + SDK + NEVER) == SDK


@pytest.mark.parametrize("api_key", [None, "sk-operator", ""])
def test_credentials_cookies_and_forwarding_never_go_whoever_s_key(api_key: str | None) -> None:
    out = names(req([*NEVER, ("Authorization", "Bearer client")], api_key=api_key))
    assert out == {None: ["authorization"], "sk-operator": ["authorization"], "": []}[api_key]
    assert ("authorization", "Bearer sk-operator") in req([], api_key="sk-operator")


HOP = [
    ("Connection", "keep-alive"),
    ("Keep-Alive", "timeout=5"),
    ("Proxy-Authenticate", "Basic"),
    ("Proxy-Authorization", "Basic abc"),
    ("Proxy-Connection", "keep-alive"),
    ("TE", "trailers"),
    ("Trailer", "X-Checksum"),
    ("Trailers", "X-Checksum"),
    ("Transfer-Encoding", "chunked"),
    ("Upgrade", "h2c"),
]


def test_hop_by_hop_list_is_complete() -> None:
    assert {name.lower() for name, _ in HOP} == HOP_BY_HOP


def test_hop_by_hop_removed_from_requests() -> None:
    kept = [("Content-Type", "application/json"), ("X-Stainless-Lang", "python")]
    assert req(HOP + kept) == kept


def test_hop_by_hop_removed_from_responses() -> None:
    kept = [("Content-Type", "text/event-stream"), ("X-Request-Id", "r1"), ("Content-Length", "9")]
    assert response_headers(HOP + kept, decoded=False) == kept


@pytest.mark.parametrize("direction", ["request", "response"])
def test_headers_named_by_connection_are_removed(direction: str) -> None:
    headers = [
        ("Connection", "User-Agent, x-stainless-os ,, close"),
        ("connection", "Accept"),
        ("user-agent", "1"),
        ("X-STAINLESS-OS", "2"),
        ("Accept", "3"),
        ("Content-Type", "4"),
    ]
    out = req(headers) if direction == "request" else response_headers(headers, decoded=False)
    assert out == [("Content-Type", "4")]


def test_host_and_content_length_dropped_from_requests_only() -> None:
    headers = [("Host", "gateway:8080"), ("Content-Length", "12"), ("Accept", "*/*")]
    assert req(headers) == [("Accept", "*/*")]
    assert response_headers(headers, decoded=False) == headers


def test_gateway_headers_never_go() -> None:
    headers = [("X-Session-Id", "s1"), ("x-user-id", "u1"), ("X-Memory-Mode", "off")]
    assert {name.lower() for name, _ in headers} == GATEWAY_REQUEST_HEADERS
    assert req([*headers, ("Accept", "a")]) == [("Accept", "a")]


@pytest.mark.parametrize(
    ("api_key", "expected"),
    [
        (None, [("Authorization", "Bearer client"), ("Accept", "a")]),
        ("sk-gw", [("Accept", "a"), ("authorization", "Bearer sk-gw")]),
    ],
)
def test_api_key_replaces_authorization(api_key: str | None, expected: Headers) -> None:
    assert req([("Authorization", "Bearer client"), ("Accept", "a")], api_key=api_key) == expected


def test_api_key_added_when_client_sent_none() -> None:
    assert req([("Accept", "a")], api_key="k") == [("Accept", "a"), ("authorization", "Bearer k")]


def test_the_account_is_the_clients_to_choose_with_its_own_key_only() -> None:
    sent = [("OpenAI-Organization", "org-1"), ("OpenAI-Project", "proj-1"), ("Accept", "a")]
    assert req(sent, api_key=None) == sent
    assert req(sent, api_key="sk-gw") == [("Accept", "a"), ("authorization", "Bearer sk-gw")]
    assert req(sent, api_key="") == [("Accept", "a")]


def test_a_rewritten_body_asks_identity_and_drops_the_clients_encodings() -> None:
    headers = [("Accept-Encoding", "gzip, br"), ("Content-Encoding", "gzip"), ("Accept", "a")]
    assert req(headers, rewritten=True) == [("Accept", "a"), ("accept-encoding", "identity")]
    assert req(headers, rewritten=False) == headers  # relayed as sent: its encoding holds
    assert req([], rewritten=True) == [("accept-encoding", "identity")]


def test_all_request_options_together() -> None:
    headers = [
        ("Host", "gw"),
        ("Authorization", "Bearer c"),
        ("Accept-Encoding", "gzip"),
        ("X-Session-Id", "s"),
        ("Connection", "x-stainless-os"),
        ("X-Stainless-OS", "1"),
        ("Content-Type", "application/json"),
    ]
    out = req(headers, api_key="k", rewritten=True)
    assert out == [
        ("Content-Type", "application/json"),
        ("authorization", "Bearer k"),
        ("accept-encoding", "identity"),
    ]


def test_repeated_headers_are_all_kept_in_order() -> None:
    headers = [("X-Stainless-Lang", "1"), ("Accept", "a"), ("x-stainless-lang", "2")]
    assert req(headers) == headers
    cookies = [("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")]
    assert response_headers(cookies, decoded=True) == cookies


@pytest.mark.parametrize(
    ("decoded", "expected"),
    [
        (False, ["content-type", "content-length", "content-encoding", "x-a"]),
        (True, ["content-type", "x-a"]),
    ],
)
def test_decoded_response_drops_length_and_encoding(decoded: bool, expected: list[str]) -> None:
    headers = [
        ("Content-Type", "application/json"),
        ("Content-Length", "10"),
        ("Content-Encoding", "gzip"),
        ("Transfer-Encoding", "chunked"),
        ("X-A", "a"),
    ]
    assert names(response_headers(headers, decoded=decoded)) == expected


def test_inputs_may_be_any_iterable() -> None:
    def gen() -> Headers:
        return [("Connection", "accept"), ("Accept", "1"), ("User-Agent", "2")]

    assert req(iter(gen())) == [("User-Agent", "2")]
    assert response_headers(iter(gen()), decoded=False) == [("User-Agent", "2")]


def test_the_operator_adds_names_and_prefixes() -> None:
    allowlist = Allowlist.extended(["HTTP-Referer", "X-Title", "x-trace-*"])
    sent = [("HTTP-Referer", "r"), ("X-Title", "t"), ("X-Trace-Id", "1"), ("X-Other", "o")]
    assert names(req(sent, allowlist=allowlist)) == ["http-referer", "x-title", "x-trace-id"]
    assert req(sent) == []  # none of them by default


def test_no_configuration_forwards_what_the_gateway_writes() -> None:
    allowlist = Allowlist.extended(["authorization", "x-*", "openai-*", "host", "cookie"])
    sent = [
        ("Authorization", "Bearer client"),
        ("X-Session-Id", "s"),
        ("X-User-Id", "u"),
        ("OpenAI-Project", "p"),
        ("Host", "h"),
        ("Transfer-Encoding", "chunked"),
        ("Cookie", "c=1"),  # not the gateway's: the operator may forward it
        ("X-Trace", "t"),
    ]
    out = req(sent, api_key="sk-gw", allowlist=allowlist)
    assert out == [("Cookie", "c=1"), ("X-Trace", "t"), ("authorization", "Bearer sk-gw")]


def test_the_configuration_takes_names_and_prefixes_only(caplog: pytest.LogCaptureFixture) -> None:
    assert not FORWARDED_HEADERS & MANAGED_HEADERS
    for entry in ["*", "a b", "x-*-y", "", "naïve"]:
        with pytest.raises(ValueError, match="forward_headers"):
            config.UpstreamConfig(forward_headers=[entry])
    upstream = config.UpstreamConfig(forward_headers=["X-Title", "x-trace-*", "Authorization"])
    allowlist = Allowlist.extended(upstream.forward_headers)
    assert allowlist.allows("x-title") and allowlist.allows("x-trace-id")
    assert not allowlist.allows("authorization")
    assert "authorization is the gateway's own to send" in caplog.text
