"""Which headers cross the proxy, in each direction."""

from __future__ import annotations

import pytest

from gateway.upstream.headers import (
    GATEWAY_REQUEST_HEADERS,
    HOP_BY_HOP,
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
    strip: bool = False,
    identity: bool = False,
) -> Headers:
    return request_headers(
        headers, api_key=api_key, strip_gateway_headers=strip, identity_encoding=identity
    )


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
    kept = [("Content-Type", "application/json"), ("X-Request-Id", "r1")]
    assert req(HOP + kept) == kept


def test_hop_by_hop_removed_from_responses() -> None:
    kept = [("Content-Type", "text/event-stream"), ("X-Request-Id", "r1"), ("Content-Length", "9")]
    assert response_headers(HOP + kept, decoded=False) == kept


@pytest.mark.parametrize("direction", ["request", "response"])
def test_headers_named_by_connection_are_removed(direction: str) -> None:
    headers = [
        ("Connection", "X-Foo, x-bar ,, close"),
        ("connection", "X-Baz"),
        ("x-foo", "1"),
        ("X-BAR", "2"),
        ("X-Baz", "3"),
        ("X-Kept", "4"),
    ]
    out = req(headers) if direction == "request" else response_headers(headers, decoded=False)
    assert out == [("X-Kept", "4")]


def test_host_and_content_length_dropped_from_requests_only() -> None:
    headers = [("Host", "gateway:8080"), ("Content-Length", "12"), ("Accept", "*/*")]
    assert req(headers) == [("Accept", "*/*")]
    assert response_headers(headers, decoded=False) == headers


def test_gateway_headers_stripped_only_when_asked() -> None:
    headers = [
        ("X-Session-Id", "s1"),
        ("x-user-id", "u1"),
        ("X-Memory-Mode", "off"),
        ("X-Other", "o"),
    ]
    assert {name.lower() for name, _ in headers[:3]} == GATEWAY_REQUEST_HEADERS
    assert req(headers, strip=False) == headers
    assert req(headers, strip=True) == [("X-Other", "o")]


@pytest.mark.parametrize(
    ("api_key", "expected"),
    [
        (None, [("Authorization", "Bearer client"), ("X-A", "a")]),
        ("sk-gw", [("X-A", "a"), ("authorization", "Bearer sk-gw")]),
    ],
)
def test_api_key_replaces_authorization(api_key: str | None, expected: Headers) -> None:
    assert req([("Authorization", "Bearer client"), ("X-A", "a")], api_key=api_key) == expected


def test_api_key_added_when_client_sent_none() -> None:
    assert req([("X-A", "a")], api_key="k") == [("X-A", "a"), ("authorization", "Bearer k")]


def test_identity_encoding_replaces_accept_encoding() -> None:
    headers = [("Accept-Encoding", "gzip, br"), ("X-A", "a")]
    assert req(headers, identity=True) == [("X-A", "a"), ("accept-encoding", "identity")]
    assert req(headers, identity=False) == headers


def test_identity_encoding_added_when_client_sent_none() -> None:
    assert req([], identity=True) == [("accept-encoding", "identity")]


def test_all_request_options_together() -> None:
    headers = [
        ("Host", "gw"),
        ("Authorization", "Bearer c"),
        ("Accept-Encoding", "gzip"),
        ("X-Session-Id", "s"),
        ("Connection", "x-hop"),
        ("X-Hop", "1"),
        ("Content-Type", "application/json"),
    ]
    out = req(headers, api_key="k", strip=True, identity=True)
    assert out == [
        ("Content-Type", "application/json"),
        ("authorization", "Bearer k"),
        ("accept-encoding", "identity"),
    ]


def test_repeated_headers_are_all_kept_in_order() -> None:
    headers = [("X-Multi", "1"), ("Accept", "a"), ("X-Multi", "2")]
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
        return [("Connection", "x-a"), ("X-A", "1"), ("X-B", "2")]

    assert req(iter(gen())) == [("X-B", "2")]
    assert response_headers(iter(gen()), decoded=False) == [("X-B", "2")]


def test_no_key_at_all_drops_the_clients_and_sends_none() -> None:
    sent = [("Authorization", "Bearer mg-issued"), ("OpenAI-Project", "p"), ("X-A", "a")]
    assert req(sent, api_key="") == [("X-A", "a")]


@pytest.mark.parametrize("api_key", ["sk-gw", ""])
def test_the_clients_other_credentials_go_nowhere_with_the_gateways_key(api_key: str) -> None:
    sent = [("api-key", "azure"), ("X-Api-Key", "anthropic"), ("Cookie", "s=1"), ("X-A", "a")]
    assert names(req(sent, api_key=api_key)) == ["x-a"] + (["authorization"] if api_key else [])
    assert req(sent, api_key=None) == sent  # the client's own key: its headers as it sent them


def test_what_earlier_proxies_said_of_the_client_is_not_forwarded() -> None:
    sent = [
        ("Forwarded", "for=10.0.0.1"),
        ("X-Forwarded-For", "10.0.0.1"),
        ("X-Forwarded-Host", "internal"),
        ("X-Forwarded-Proto", "http"),
        ("X-Real-IP", "10.0.0.1"),
        ("User-Agent", "OpenAI/Python"),
    ]
    assert req(sent) == [("User-Agent", "OpenAI/Python")]
