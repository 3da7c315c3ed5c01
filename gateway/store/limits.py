"""The rate limits' counters in Redis: one script call admits a request against every
scope of its caller (``scripts/admit.lua``), and one pipeline gives its in-flight slots
back and charges its tokens. The policy and the middleware are
``gateway.http.rate_limits``'; the keys are ``keys.limit_*``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.store.calls import StoreCalls
from gateway.store.keys import limit_counters, limit_in_flight
from gateway.store.link import Command


class LimitCounters:
    """Admits requests against their scopes' counters, and releases their leases."""

    def __init__(self, calls: StoreCalls) -> None:
        self._calls = calls

    async def admit(self, scopes: Sequence[str], window: int, args: Sequence[Any]) -> list[Any]:
        """``admit.lua``'s reply for the scopes' counters of minute ``window``; ``args``:
        its ARGV. ``StoreUnavailable`` when Redis did not answer, or answered an error."""
        keys = [key for scope in scopes for key in limit_counters(scope, window)]
        call = self._calls.script("admit", keys, args)
        (reply,) = await self._calls.execute([call], op="admit")
        return list(reply)

    async def release(
        self,
        lease_id: str,
        *,
        in_flight: Sequence[str],
        charged: Sequence[str],
        window: int,
        tokens: int,
        ttl_s: int,
    ) -> None:
        """The lease's slot given back in the ``in_flight`` scopes, ``tokens`` charged to
        the ``charged`` scopes' current minute (``window``), its counter kept ``ttl_s``."""
        commands: list[Command] = [("ZREM", limit_in_flight(s), lease_id) for s in in_flight]
        for scope in charged:
            counter = limit_counters(scope, window)[3]
            commands += [("INCRBY", counter, tokens), ("EXPIRE", counter, ttl_s)]
        if commands:
            await self._calls.execute(commands, op="rate_release", needed=0)
