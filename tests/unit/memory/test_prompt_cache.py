"""The model of provider prompt caching: OpenAI's minimum and steps, a local server's
whole common prefix, no cache; and what a prompt costs with part of it cached."""

from __future__ import annotations

import pytest

from gateway.memory.prompt_cache import (
    CachePolicy,
    billed_equivalent,
    cacheable_tokens,
    cached_tokens,
    common_prefix,
    fingerprint,
    message_print,
    shared_tokens,
)


@pytest.mark.parametrize(
    ("policy", "common", "cacheable"),
    [
        ("openai", 0, 0),
        ("openai", 1023, 0),  # under the minimum: nothing
        ("openai", 1024, 1024),  # the minimum
        ("openai", 1151, 1024),  # one short of the next step
        ("openai", 1152, 1152),  # the next step
        ("openai", 1279, 1152),
        ("openai", 18_000, 17_920),
        ("prefix", 0, 0),
        ("prefix", 1, 1),
        ("prefix", 1023, 1023),  # a local server re-uses any prefix
        ("prefix", 1151, 1151),
        ("none", 1023, 0),
        ("none", 1152, 0),
        ("none", 18_000, 0),
    ],
)
def test_cacheable_tokens_by_policy(policy: CachePolicy, common: int, cacheable: int) -> None:
    assert cacheable_tokens(policy, common) == cacheable


def test_openai_minimum_and_step_can_be_another_providers() -> None:
    assert cacheable_tokens("openai", 2047, minimum=2048, step=256) == 0
    assert cacheable_tokens("openai", 2400, minimum=2048, step=256) == 2304


@pytest.mark.parametrize(
    ("current", "previous", "common"),
    [
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3, 4], [1, 2, 3], 3),  # the previous prompt, and one more message
        ([1, 2, 3], [1, 2, 3, 4], 3),
        ([1, 9, 3], [1, 2, 3], 1),  # a change early breaks everything after it
        ([9, 2, 3], [1, 2, 3], 0),
        ([], [1], 0),
    ],
)
def test_common_prefix(current: list[int], previous: list[int], common: int) -> None:
    assert common_prefix(current, previous) == common


def test_cached_tokens_compares_with_the_previous_prompt() -> None:
    previous = list(range(1200))
    assert cached_tokens("openai", [*previous, 5, 6], previous) == 1152
    assert cached_tokens("prefix", [*previous, 5, 6], previous) == 1200
    assert cached_tokens("none", [*previous, 5, 6], previous) == 0
    changed = [7, *previous[1:]]
    assert cached_tokens("prefix", changed, previous) == 0
    assert cached_tokens("openai", previous, None) == 0  # a first prompt


@pytest.mark.parametrize(
    ("prompt", "cached", "discount", "billed"),
    [
        (3000, 0, 0.9, 3000),
        (18_000, 17_920, 0.5, 80 + 8960),
        (18_000, 17_920, 0.9, 80 + 1792),
        (2000, 2000, 1.0, 0),
        (2000, 1024, 0.0, 2000),
    ],
)
def test_billed_equivalent(prompt: int, cached: int, discount: float, billed: float) -> None:
    assert billed_equivalent(prompt, cached, discount) == pytest.approx(billed)


def test_nonsense_is_refused() -> None:
    with pytest.raises(ValueError):
        cacheable_tokens("openai", -1)
    with pytest.raises(ValueError):
        cacheable_tokens("lru", 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        billed_equivalent(100, 101, 0.5)
    with pytest.raises(ValueError):
        billed_equivalent(100, 50, 1.5)


def test_shared_tokens_counts_the_leading_messages_alike() -> None:
    a = [message_print(b"system: be brief", 5), message_print(b"memory", 100)]
    b = [*a, message_print(b"user: hi", 4)]
    assert shared_tokens(fingerprint(b), fingerprint(a)) == 105
    changed = [a[0], message_print(b"memory, changed", 100), b[2]]
    assert shared_tokens(fingerprint(changed), fingerprint(b)) == 5
    assert shared_tokens(fingerprint(b), "") == 0
    assert shared_tokens(fingerprint(b), "garbage") == 0
    assert shared_tokens("x:notanumber", "x:notanumber") == 0
