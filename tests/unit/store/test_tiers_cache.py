"""The tiers document is parsed once per stored version, never trusted over the bytes."""

from __future__ import annotations

from gateway.memory.model import Fact, Summary, Tiers
from gateway.store.keys import SessionKeys
from gateway.store.tiers_cache import TiersCache

ALICE = SessionKeys("t", "alice")
BOB = SessionKeys("t", "bob")


def document(version: int, text: str = "The user plans a trip.") -> bytes:
    tiers = Tiers(
        version=version,
        summaries=(Summary(1, 20, text),),
        facts=(Fact("the booking reference is 48213", 4),),
    )
    return tiers.to_json().encode()


def test_unchanged_bytes_reuse_the_parse() -> None:
    cache = TiersCache()
    first = cache.parse(ALICE, document(3))
    again = cache.parse(ALICE, document(3))  # equal bytes, another object (a new reply)
    assert again is first
    assert again == Tiers.from_json(document(3))


def test_a_rewritten_document_is_parsed_again() -> None:
    cache = TiersCache()
    cache.parse(ALICE, document(3))
    newer = cache.parse(ALICE, document(4, "The user booked the trip."))
    assert newer.version == 4
    assert newer.summaries[0].text == "The user booked the trip."


def test_the_same_bytes_of_another_session_are_that_sessions_own() -> None:
    cache = TiersCache()
    alice = cache.parse(ALICE, document(3))
    bob = cache.parse(BOB, document(3))
    assert bob == alice
    assert cache.parse(ALICE, document(5)).version == 5
    assert cache.parse(BOB, document(3)) is bob


def test_no_document_is_empty_tiers() -> None:
    cache = TiersCache()
    assert cache.parse(ALICE, None) == Tiers()
    assert cache.parse(ALICE, b"") == Tiers()


def test_bounded_the_oldest_session_is_forgotten() -> None:
    cache = TiersCache(size=2)
    alice = cache.parse(ALICE, document(1))
    cache.parse(BOB, document(1))
    cache.parse(SessionKeys("t", "carol"), document(1))
    again = cache.parse(ALICE, document(1))
    assert again == alice
    assert again is not alice  # parsed anew: alice had been forgotten
