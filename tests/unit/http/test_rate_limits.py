"""Rate limits' pure parts: which limits a caller gets (its client address's too), the
sliding window's arithmetic, the 429 a refusal becomes, what a chat turn is charged, what
a request's prompt is estimated at, and what an answer's usage says it took."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import pytest
from starlette.datastructures import Headers

from gateway.auth.authenticator import Caller, key_id
from gateway.config import ConfigError, RateLimit, Settings, parse_settings
from gateway.http.limit_policy import (
    WINDOW_S,
    LimitPolicy,
    Limits,
    LimitScope,
    groups_of,
    refusal,
    retry_after_s,
    window_of,
)
from gateway.http.rate_limits import _CURRENT, Lease, charge, rate_limiter
from gateway.http.token_costs import TAIL_BYTES, UNKNOWN, Tail, body_tokens, length_tokens
from gateway.memory.model import Message
from gateway.service.turn import Answered
from gateway.service.usage import read_usage
from gateway.text.tokens import TokenCounter
from tests.support.store_fakes import UnusedLimits

KEY_A = "team-a-key-0123456789abcdef"
KEY_B = "team-a-key-fedcba9876543210"


def keys_mode(config: dict[str, Any], **key_a: Any) -> Settings:
    return parse_settings(
        {
            "upstream": {"api_key": "sk-operator-0123456789"},
            "auth": {
                "mode": "keys",
                "keys": [
                    {"key": KEY_A, "tenant": "team-a", **key_a},
                    {"key": KEY_B, "tenant": "team-a"},
                ],
            },
            "limits": config,
        },
        environ={},
    )


def gateway_caller(key: str, tenant: str) -> Caller:
    return Caller("", key_id(key), None, None, True, None, "\x00gateway-tenant:" + tenant)


def forward_caller(key: str) -> Caller:
    return Caller("", key_id(key), None, None, True, None, key)


def test_limits_are_off_by_default() -> None:
    settings = Settings()
    assert settings.limits.tenant == RateLimit()
    assert not LimitPolicy(settings).active
    assert rate_limiter(settings, store=UnusedLimits()) is None


def test_negative_limits_are_refused_with_their_path() -> None:
    with pytest.raises(ConfigError, match=r"limits\.tenant\.requests_per_minute"):
        parse_settings({"limits": {"tenant": {"requests_per_minute": -1}}}, environ={})
    with pytest.raises(ConfigError, match=r"limits\.tenant\.per_hour: unknown key"):
        parse_settings({"limits": {"tenant": {"per_hour": 5}}}, environ={})


def test_forward_mode_has_one_scope_per_key_with_the_tighter_limits() -> None:
    settings = parse_settings(
        {
            "limits": {
                "tenant": {"requests_per_minute": 100, "concurrent": 4},
                "key": {"requests_per_minute": 10, "tokens_per_minute": 500},
            }
        },
        environ={},
    )
    scopes = LimitPolicy(settings).scopes(forward_caller("sk-client-one-123456"))
    assert [s.name for s in scopes] == ["tenant"]
    assert scopes[0].limits == Limits(requests=10, tokens=500, in_flight=4)
    other = LimitPolicy(settings).scopes(forward_caller("sk-client-two-123456"))
    assert other[0].prefix != scopes[0].prefix  # each key its own counters


def test_keys_mode_has_a_tenant_scope_and_a_key_scope_in_one_slot() -> None:
    settings = keys_mode({"tenant": {"requests_per_minute": 30}, "key": {"concurrent": 2}})
    policy = LimitPolicy(settings)
    a = policy.scopes(gateway_caller(KEY_A, "team-a"))
    b = policy.scopes(gateway_caller(KEY_B, "team-a"))
    assert [s.name for s in a] == ["tenant", "key"]
    assert a[0] == b[0]  # one tenant: shared counters
    assert a[1].prefix != b[1].prefix  # its keys: their own
    # Every key of a caller shares the tenant's hash tag (one script, one cluster slot).
    tag = a[0].prefix.split("{")[1].split("}")[0]
    assert all(f"{{{tag}}}" in key for scope in a for key in scope.keys(7))
    assert key_id(KEY_A) not in tag  # the tenant's hash, not a key's


def test_per_tenant_and_per_key_overrides_change_only_the_fields_they_set() -> None:
    settings = keys_mode(
        {
            "tenant": {"requests_per_minute": 30, "tokens_per_minute": 1000},
            "key": {"requests_per_minute": 10, "concurrent": 3},
            "tenants": {"team-a": {"requests_per_minute": 300}},
        },
        limits={"concurrent": 1},
    )
    policy = LimitPolicy(settings)
    tenant, key_a = policy.scopes(gateway_caller(KEY_A, "team-a"))
    assert tenant.limits == Limits(requests=300, tokens=1000)
    assert key_a.limits == Limits(requests=10, in_flight=1)
    _, key_b = policy.scopes(gateway_caller(KEY_B, "team-a"))
    assert key_b.limits == Limits(requests=10, in_flight=3)
    other = policy.scopes(gateway_caller("made-by-the-admin-api-0000", "team-b"))
    assert other[0].limits == Limits(requests=30, tokens=1000)


def test_a_caller_without_limits_gets_no_scope() -> None:
    settings = keys_mode({"tenants": {"team-a": {"concurrent": 5}}})
    policy = LimitPolicy(settings)
    assert policy.active
    assert [s.name for s in policy.scopes(gateway_caller(KEY_A, "team-a"))] == ["tenant"]
    assert policy.scopes(gateway_caller(KEY_A, "team-b")) == []


def test_a_minute_is_numbered_from_the_epoch() -> None:
    assert window_of(120.0) == (2, 0.0)
    window, elapsed = window_of(125.5)
    assert (window, elapsed) == (2, 5.5)


@pytest.mark.parametrize(
    ("previous", "current", "limit", "elapsed", "expected"),
    [
        # The previous minute's 10 weigh 10 * (1 - f); 4 this minute; 10 a minute allowed:
        # one more fits once 10 * (1 - f) <= 5, at f = 0.5 (30 s), 20 s from now.
        (10, 4, 10, 10.0, 20),
        # This minute alone is full: the next one, and then until the weighted count
        # leaves room (10 * (1 - f) <= 9: f = 0.1, 6 s into it).
        (0, 10, 10, 50.0, 10 + 6),
        # Far over (tokens charged after a long answer): most of the next minute too
        # (1000 * (1 - f) <= 99: f = 0.901, 54.06 s into it).
        (0, 1000, 100, 0.0, 60 + 55),
        # At least a second, never 0 (the count may be on the edge).
        (1, 1, 2, 59.99, 1),
    ],
)
def test_retry_after_is_when_the_sliding_count_leaves_room(
    previous: int, current: int, limit: int, elapsed: float, expected: int
) -> None:
    wait = retry_after_s(previous, current, limit, elapsed)
    assert wait == expected
    # And indeed: at that time the sliding count has room for one more (no new requests).
    at = elapsed + wait
    if at < WINDOW_S:
        count = previous * (1 - at / WINDOW_S) + current
    else:
        count = current * (1 - (at - WINDOW_S) / WINDOW_S) if at < 2 * WINDOW_S else 0
    assert count + 1 <= limit + 1e-9


def test_a_refusal_is_openais_429() -> None:
    scope = LimitScope("key", "p", Limits(requests=10, tokens=500, in_flight=2))
    error = refusal(scope, 2, 0, 600, 30.0)
    assert error.status == 429
    body = error.body()["error"]
    assert body["type"] == "tokens"
    assert body["code"] == "rate_limit_exceeded"
    assert "tokens per min (TPM)" in body["message"]
    assert "Limit 500" in body["message"]
    headers = error.response_headers()
    assert int(headers["retry-after"]) == retry_after_s(0, 600, 500, 30.0)
    assert headers["x-ratelimit-limit-tokens"] == "500"
    assert headers["x-ratelimit-remaining-tokens"] == "0"
    assert headers["x-ratelimit-reset-tokens"] == headers["retry-after"] + "s"

    requests = refusal(scope, 1, 3, 8, 10.0)
    assert requests.body()["error"]["type"] == "requests"
    assert requests.response_headers()["x-ratelimit-limit-requests"] == "10"

    in_flight = refusal(scope, 3, 0, 0, 10.0)
    assert in_flight.body()["error"]["type"] == "requests"
    assert "in flight" in in_flight.body()["error"]["message"]
    assert in_flight.response_headers() == {"retry-after": "1"}


def _answered(answer: Message | None, usage: Any, context_tokens: int = 120) -> Answered:
    """A turn whose context took ``context_tokens``, answered so (as ``TurnService``
    reports it)."""
    count = partial(TokenCounter().count_payload, model="gpt-4o-mini")
    read = read_usage(usage)
    prompt, cached, completion = read.prompt_tokens, read.cached_tokens, read.completion_tokens
    return Answered(context_tokens, prompt, cached, completion, answer, count)


def _charged(answer: Message | None, usage: Any, limits: Limits) -> int:
    lease = Lease([LimitScope("tenant", "p", limits)], "lease")
    token = _CURRENT.set(lease)
    try:
        charge(_answered(answer, usage))
    finally:
        _CURRENT.reset(token)
    return lease.tokens + sum(count() for count in lease.pending)


def test_a_turn_is_charged_the_upstreams_usage_when_it_gave_one() -> None:
    answer = Message("assistant", "four words of answer")
    usage = {"prompt_tokens": 300, "completion_tokens": 7}
    assert _charged(answer, usage, Limits(tokens=1000)) == 307


def test_without_usage_the_forwarded_context_and_the_answer_are_counted() -> None:
    answer = Message("assistant", "hello there")
    counted = TokenCounter().count_payload(answer.to_openai(), "gpt-4o-mini")
    assert counted > 0
    assert _charged(answer, None, Limits(tokens=1000)) == 120 + counted
    # A long answer is estimated (4 characters a token), not tokenized on the loop.
    long = Message("assistant", "x" * 40_000)
    assert _charged(long, None, Limits(tokens=1000)) == 120 + 10_000


def test_nothing_is_charged_without_a_token_limit_or_an_answer() -> None:
    answer = Message("assistant", "hello there")
    assert _charged(answer, None, Limits(requests=5)) == 0
    assert _charged(None, None, Limits(tokens=1000)) == 0
    charge(_answered(answer, None))  # no request being limited: no-op


def test_a_reservation_waits_for_room_for_all_of_it() -> None:
    # 2,000 of 3,000 used this minute, 30 s in: 1,400 more fit only once 2,000 * (1 - f)
    # <= 1,600, in the next minute (f = 0.2: 12 s into it).
    assert retry_after_s(0, 2000, 3000, 30.0, need=1400) == 30 + 12
    # A request as large as the whole budget waits for an empty window.
    assert retry_after_s(0, 100, 3000, 30.0, need=3000) == 30 + 60
    error = refusal(LimitScope("tenant", "p", Limits(tokens=3000)), 2, 0, 2000, 30.0, 1400)
    assert "Limit 3000, Used 2000, Requested 1400." in error.body()["error"]["message"]
    assert error.response_headers()["retry-after"] == "42"


def test_the_address_scope_is_the_clients_64_and_trusted_proxies_are_exempt() -> None:
    settings = parse_settings(
        {
            "limits": {"address": {"requests_per_minute": 60}},
            "server": {"trusted_proxies": ["10.0.0.0/8"]},
        },
        environ={},
    )
    policy = LimitPolicy(settings)
    assert policy.active
    assert policy.scopes(forward_caller("sk-client-one-123456")) == []  # no tenant limits
    (one,) = policy.address_scopes("2001:db8:1:2::1")
    (same,) = policy.address_scopes("2001:db8:1:2:ffff::9")
    (other,) = policy.address_scopes("2001:db8:1:3::1")
    assert one.prefix == same.prefix != other.prefix
    assert one.name == "address" and one.limits == Limits(requests=60)
    assert "2001" not in one.prefix  # a hash of the address, never the address
    assert policy.address_scopes("10.1.2.3") == []  # a trusted proxy
    assert policy.address_scopes(None) == []
    # Its own slot: one script call for it, another for the tenant's.
    keyed = keys_mode({"tenant": {"concurrent": 2}, "address": {"concurrent": 4}})
    both = LimitPolicy(keyed).scopes(gateway_caller(KEY_A, "team-a"))
    both += LimitPolicy(keyed).address_scopes("192.0.2.7")
    assert [[s.name for s in group] for group in groups_of(both)] == [["tenant"], ["address"]]


def test_a_lease_settles_to_what_the_answer_took() -> None:
    lease = Lease([LimitScope("tenant", "p", Limits(tokens=1000))], "lease")
    lease.reserved = 400
    assert lease.settlement() == 0  # nothing said: the reservation stands
    lease.took(150)
    assert lease.settlement() == -250  # given back
    lease.took(900)
    assert lease.settlement() == 500  # charged beyond it


def test_a_prompt_is_estimated_by_its_bytes_and_an_image_by_its_cost() -> None:
    text = Message("user", "x" * 4000)
    assert body_tokens(4100, [text]) == 1025
    png = "data:image/png;base64," + "A" * 400_000  # no size in its head: 1024x1024
    image = Message(
        "user",
        [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": png}}],
    )
    tokens = body_tokens(400_200, [image])
    # Its other bytes a token every 4, and the image at its cost (its size unknown).
    assert tokens == math.ceil((400_200 - len(png)) / 4) + 765
    # A body not parsed is estimated by its length; an upload is no prompt, but on a
    # path that takes one any body is.
    json_body = Headers({"content-type": "application/json", "content-length": "4000"})
    assert length_tokens("/v1/embeddings", json_body) == 1000
    upload = Headers({"content-type": "multipart/form-data; b=x", "content-length": "9000000"})
    assert length_tokens("/v1/audio/transcriptions", upload) == 0
    assert length_tokens("/v1/chat/completions", upload) == 2_250_000
    assert length_tokens("/v1/embeddings", Headers({"transfer-encoding": "chunked"})) == UNKNOWN
    assert length_tokens("/v1/models", Headers({})) == 0
    assert length_tokens("/v1/embeddings", json_body, b"x" * 10) == 3


@pytest.mark.parametrize(
    ("answer", "tokens"),
    [
        # A whole chat answer, an embeddings answer, a Responses answer.
        (
            b'{"choices":[],"usage":{"prompt_tokens":30,"completion_tokens":7,"total_tokens":37}}',
            37,
        ),
        (b'{"data":[{"embedding":[0.1]}],"usage":{"prompt_tokens":8,"total_tokens":8}}', 8),
        (b'{"output":[],"usage":{"input_tokens":20,"output_tokens":3},"user":null}', 23),
        # Anthropic's: its input_tokens leave out what the prompt cache read and wrote.
        (
            b'{"type":"message","usage":{"input_tokens":20,"cache_read_input_tokens":900,'
            b'"cache_creation_input_tokens":40,"output_tokens":3}}',
            963,
        ),
        # A stream: usage null in each chunk, then the usage chunk, then [DONE].
        (
            b'data: {"choices":[{"delta":{}}],"usage":null}\n\n'
            b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,'
            b'"prompt_tokens_details":{"cached_tokens":0},"total_tokens":7}}\n\n'
            b"data: [DONE]\n\n",
            7,
        ),
        # A model's text that quotes a usage is escaped in its JSON string: not read.
        (b'{"choices":[{"message":{"content":"\\"usage\\": {\\"total_tokens\\": 1}"}}]}', None),
        (b'{"usage": "many"}', None),
        (b"not json at all", None),
    ],
)
def test_an_answers_usage_is_read_from_its_end(answer: bytes, tokens: int | None) -> None:
    tail = Tail()
    for at in range(0, len(answer), 7):  # in pieces, as relayed
        tail.add(answer[at : at + 7])
    assert tail.tokens() == tokens


def test_only_an_answers_last_bytes_are_kept() -> None:
    tail = Tail()
    tail.add(b'{"usage":{"total_tokens":99}}')
    tail.add(b" " * TAIL_BYTES)
    assert tail.tokens() is None
    tail.add(b'{"usage":{"total_tokens":5}}')
    assert tail.tokens() == 5
