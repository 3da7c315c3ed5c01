"""Rate limits' pure parts: which limits a caller gets, the sliding window's arithmetic,
the 429 a refusal becomes, and what a chat turn is charged."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from gateway.auth.authenticator import Caller, key_id
from gateway.config import ConfigError, RateLimit, Settings, parse_settings
from gateway.http.rate_limits import (
    _CURRENT,
    WINDOW_S,
    Lease,
    LimitPolicy,
    Limits,
    LimitScope,
    charge,
    rate_limiter,
    refusal,
    retry_after_s,
    window_of,
)
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
