"""The rate limits' counters in Redis: one script call admits a request against every
scope of one slot (``scripts/admit.lua``), another reserves its prompt's tokens
(``scripts/limit_reserve.lua``), and one pipeline gives its in-flight slots back and
settles its tokens. The policy and the middleware are ``gateway.http.rate_limits``'; the keys
are ``keys.limit_*``.

A caller's scopes may be in more than one slot (its tenant's, and its client address's:
``limits.address``): each slot's scopes are one ``group``, one script call each, all of
them in one round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.store.calls import StoreCalls
from gateway.store.keys import limit_counters, limit_in_flight
from gateway.store.link import Command

# One slot's script call: its scopes' key prefixes, and the script's ARGV.
Group = tuple[Sequence[str], Sequence[Any]]


class LimitCounters:
    """Admits requests against their scopes' counters, and releases their leases."""

    def __init__(self, calls: StoreCalls) -> None:
        self._calls = calls

    async def admit(self, groups: Sequence[Group], window: int) -> list[list[Any]]:
        """``admit.lua``'s reply for each group of scopes' counters of minute ``window``.
        ``StoreUnavailable`` when Redis did not answer, or answered an error."""
        calls = [
            self._calls.script(
                "admit", [key for scope in scopes for key in limit_counters(scope, window)], args
            )
            for scopes, args in groups
        ]
        return [list(reply) for reply in await self._calls.execute(calls, op="admit")]

    async def reserve(self, groups: Sequence[Group], window: int) -> list[list[Any]]:
        """``limit_reserve.lua``'s reply for each group of scopes' token counters of minute
        ``window``. ``StoreUnavailable`` as ``admit``."""
        calls = [
            self._calls.script(
                "limit_reserve",
                [key for scope in scopes for key in limit_counters(scope, window)[2:4]],
                args,
            )
            for scopes, args in groups
        ]
        return [list(reply) for reply in await self._calls.execute(calls, op="limit_reserve")]

    async def release(
        self,
        lease_id: str,
        *,
        in_flight: Sequence[str],
        charged: Sequence[str],
        window: int,
        tokens: int,
        ttl_s: int,
        uncounted: Sequence[str] = (),
    ) -> None:
        """The lease's slot given back in the ``in_flight`` scopes, ``tokens`` (negative:
        given back) added to the ``charged`` scopes' minute ``window``, its counter kept
        ``ttl_s``; one request taken off the ``uncounted`` scopes' minute ``window`` (an
        admission undone)."""
        commands: list[Command] = [("ZREM", limit_in_flight(s), lease_id) for s in in_flight]
        for scope in charged:
            counter = limit_counters(scope, window)[3]
            commands += [("INCRBY", counter, tokens), ("EXPIRE", counter, ttl_s)]
        commands += [("DECR", limit_counters(scope, window)[1]) for scope in uncounted]
        if commands:
            await self._calls.execute(commands, op="rate_release", needed=0)
