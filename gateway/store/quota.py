"""A tenant's storage quota, kept by Redis: bytes are charged before they are written,
atomically with the check that they fit (``quota_reserve.lua``), and settled by the write
that stores them (``quota_settle.lua``, in the record's round trip).

The count (``usage_key``) is the tenant's stored bytes and those held for writes under
way. A turn's hold is a lease (in ``held_key``: its id and bytes, scored by its expiry):
the turn's record settles it, charging what it wrote beyond it; a turn that never
records (an upstream error, a client gone) gives its bytes back when the lease expires,
at the tenant's next reservation. An import's or a pin's bytes are charged for good, and
given back by their caller if the write fails.

Both scripts touch the tenant's slot ``{tenant}`` only. A session's keys are in another
slot, so the settle cannot be in ``record.lua``: it goes in the same round trip, and is
taken back when the record appended nothing.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from gateway.store.calls import StoreCalls
from gateway.store.keys import held_key, usage_key
from gateway.store.link import Command

# A reservation without a quota: its bytes are counted all the same (a quota set later
# finds them), and always fit. Exact in Lua's numbers (doubles).
UNBOUNDED = 2**53


@dataclass(frozen=True, slots=True)
class Held:
    """Bytes charged to a tenant's quota ahead of their write. ``lease``: a turn's hold,
    settled by its record or given back when it expires; "" for bytes charged for good."""

    nbytes: int
    lease: str = ""


@dataclass(frozen=True, slots=True)
class Ask:
    """A reservation to make: ``nbytes`` of ``tenant``'s, granted only within ``quota``;
    held for ``lease_s`` (a turn's), or, with 0, charged for good."""

    tenant: str
    nbytes: int
    quota: int
    lease_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Reservation:
    """What a reservation came to: ``held`` (None: refused), and the tenant's count."""

    held: Held | None
    used: int


def reserve_call(calls: StoreCalls, ask: Ask, now: float) -> tuple[Command, Held]:
    """The script call that makes ``ask``, and what it holds when granted."""
    lease = f"{secrets.token_hex(8)}:{ask.nbytes}" if ask.lease_s > 0 else ""
    argv = [ask.nbytes, ask.quota, calls.retention_s, repr(now), lease, repr(now + ask.lease_s)]
    keys = [usage_key(ask.tenant), held_key(ask.tenant)]
    return calls.script("quota_reserve", keys, argv), Held(ask.nbytes, lease)


def reservation(reply: Any, held: Held) -> Reservation:
    granted, used = reply
    return Reservation(held if int(granted) else None, int(used))


def settle_call(calls: StoreCalls, tenant: str, written: int, held: Held | None) -> Command:
    """The script call that charges ``written`` bytes against ``held`` (0: gives it
    back); its reply is what to take back if the write turns out to have appended nothing."""
    held = held or Held(0)
    argv = [written, held.nbytes, held.lease, calls.retention_s]
    return calls.script("quota_settle", [usage_key(tenant), held_key(tenant)], argv)


def take_back_call(calls: StoreCalls, tenant: str, nbytes: int) -> Command:
    """Bytes charged for a write that stored nothing, taken off the count."""
    return calls.script("release_usage", [usage_key(tenant)], [nbytes])


class Quotas:
    """The quota's calls made on their own (the memory API's imports and pins): a
    reservation, and a hold given back. A turn's go in its load and record round trips."""

    def __init__(self, calls: StoreCalls) -> None:
        self._calls = calls

    async def reserve(self, ask: Ask, now: float) -> Reservation:
        call, held = reserve_call(self._calls, ask, now)
        (reply,) = await self._calls.execute([call], op="reserve")
        return reservation(reply, held)

    async def give_back(self, tenant: str, held: Held) -> None:
        """``held`` returned unused (its write failed, or never came)."""
        await self._calls.execute([settle_call(self._calls, tenant, 0, held)], op="give_back")
