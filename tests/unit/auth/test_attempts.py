"""Wrong keys per address (gateway/auth/attempts.py): the count, its window, the 429 past
the limit, and the bounded memory of the admin API's per-process counts."""

from __future__ import annotations

import pytest

from gateway.auth.attempts import Attempts, LocalFailures
from gateway.errors import TooManyRequests


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_past_the_limit_a_wrong_key_is_refused_until_its_window_ends() -> None:
    clock = Clock()
    attempts = Attempts(LocalFailures(clock), limit=3, window_s=60, what="wrong keys")
    for _ in range(3):
        await attempts.wrong_key("10.0.0.1")
    clock.now += 20.5
    with pytest.raises(TooManyRequests) as refused:
        await attempts.wrong_key("10.0.0.1")
    assert refused.value.status == 429 and "too many wrong keys" in refused.value.message
    # The window's end, whole seconds up: refused keys do not move it.
    assert refused.value.response_headers() == {"retry-after": "40"}
    await attempts.wrong_key("10.0.0.2")  # another address counts its own
    clock.now += 39.5  # the window (from the first failure) is over
    await attempts.wrong_key("10.0.0.1")


async def test_the_counts_of_one_process_stay_bounded() -> None:
    clock = Clock()
    failures = LocalFailures(clock, max_addresses=100)
    for n in range(1000):
        await failures.failed(f"10.0.{n // 256}.{n % 256}", 60)
        clock.now += 0.01
    assert len(failures._counts) == 100  # the oldest went first
    assert "10.0.3.231" in failures._counts and "10.0.0.0" not in failures._counts
    clock.now += 61  # every window is over: they all go at the next failure
    assert await failures.failed("10.1.0.0", 60) == (1, 60)
    assert list(failures._counts) == ["10.1.0.0"]


async def test_a_known_address_keeps_its_count_when_the_table_is_full() -> None:
    failures = LocalFailures(Clock(), max_addresses=2)
    await failures.failed("a", 60)
    await failures.failed("b", 60)
    assert await failures.failed("a", 60) == (2, 60)  # not evicted to make room for itself
    assert await failures.failed("c", 60) == (1, 60)
    assert list(failures._counts) == ["b", "c"]
