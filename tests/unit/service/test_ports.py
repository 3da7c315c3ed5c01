"""The store's Protocols and the tests' fakes of them (``tests/support/store_fakes.py``):
each fake part has every method of its Protocol, and fails the test that calls one it was
not given."""

from __future__ import annotations

from typing import Protocol

import pytest

from gateway.service.ports import SessionStore
from gateway.store.keys import SessionKeys
from tests.support.store_fakes import UNUSED_PARTS, StoreOf, UnusedSessions


def members(protocol: type) -> set[str]:
    """The public names a Protocol declares, its bases' included."""
    declared = (vars(c) for c in protocol.__mro__ if c not in (object, Protocol))
    return {name for names in declared for name in names if not name.startswith("_")}


@pytest.mark.parametrize(("fake", "protocol"), UNUSED_PARTS.items())
def test_each_unused_part_has_every_method_of_its_protocol(fake: type, protocol: type) -> None:
    assert members(protocol) <= set(dir(fake))


def test_the_check_sees_a_method_the_fake_lacks() -> None:
    class Wider(SessionStore, Protocol):
        async def extra(self) -> None: ...

    assert members(Wider) - set(dir(UnusedSessions)) == {"extra"}


async def test_a_method_the_fake_does_not_serve_fails_the_test() -> None:
    with pytest.raises(AssertionError, match=r"sessions\.meta: not used by this test"):
        await UnusedSessions().meta(SessionKeys("t", "s"))


def test_a_part_the_test_did_not_give_fails_the_test() -> None:
    store = StoreOf(sessions=UnusedSessions())
    assert isinstance(store.sessions, UnusedSessions)
    with pytest.raises(AssertionError, match=r"store\.queue: not used by this test"):
        _ = store.queue
