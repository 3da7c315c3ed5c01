"""Which client addresses are held for being refused again and again (pure, a fake clock)."""

from __future__ import annotations

from gateway.http import refused_addresses
from gateway.http.refused_addresses import HOLD_AFTER, RefusedAddresses


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def refused(record: RefusedAddresses, key: object, times: int) -> None:
    for _ in range(times):
        record.note(key)


def test_an_address_is_held_from_its_hold_after_th_refusal_and_no_other_with_it() -> None:
    record = RefusedAddresses(Clock())
    refused(record, "a", HOLD_AFTER - 1)
    assert not record.held("a")
    record.note("a")
    assert record.held("a")
    assert not record.held("b")
    assert not record.held(("another server", "a"))


def test_refusals_across_a_second_boundary_add_up() -> None:
    clock = Clock(1000.9)
    record = RefusedAddresses(clock)
    refused(record, "a", HOLD_AFTER // 2)
    clock.now = 1001.1  # the next second
    refused(record, "a", HOLD_AFTER - HOLD_AFTER // 2)
    assert record.held("a")


def test_a_held_address_that_keeps_being_refused_stays_held_and_is_let_in_once_calm() -> None:
    clock = Clock(1000.0)
    record = RefusedAddresses(clock)
    refused(record, "a", HOLD_AFTER)
    for second in range(1, 6):  # each second, a little over half the bound: still held
        clock.now = 1000.0 + second
        refused(record, "a", HOLD_AFTER // 2 + 1)
        assert record.held("a"), second
    clock.now = 1006.0  # a calm second: the last one's refusals alone are under the bound
    assert not record.held("a")
    clock.now = 1008.0  # two calm seconds: forgotten
    assert not record.held("a")
    assert "a" not in record.counts


def test_refusals_two_seconds_apart_do_not_add_up() -> None:
    clock = Clock(1000.0)
    record = RefusedAddresses(clock)
    refused(record, "a", HOLD_AFTER - 1)
    clock.now = 1002.0
    record.note("a")
    assert not record.held("a")


def test_the_record_is_bounded_and_forgets_the_address_refused_longest_ago() -> None:
    record = RefusedAddresses(Clock())
    refused(record, "held", HOLD_AFTER)
    for n in range(refused_addresses.KEPT + 5):
        record.note(n)
        if n % 1000 == 0:
            record.note("held")  # still hammering: never the one forgotten
    assert len(record.counts) == refused_addresses.KEPT
    assert record.held("held")
    assert 0 not in record.counts and refused_addresses.KEPT + 4 in record.counts
