"""Client addresses refused again and again, turned away when they connect.

A refused request still costs the gateway its whole way in: the connection, the parsed
head, a task, the middlewares, the key's identification, the 429. A client that
reopens every refused connection at once (``bench/abuse.py``'s three-address attack:
~700 a second, each refused for its tenant's limits) made that ~0.3 ms each, a third of
the event loop, and the other tenants' p99 went 3-7x their baseline. The same refusal
at the connection, before anything is read (as for ``max_connections_per_client``),
costs a fraction of it.

So an address whose requests were refused ``HOLD_AFTER`` times in this second and the
one before, each the first request of its connection, is held: its new connections are
answered 429 at once (paced and spread as every connection refusal), until the count of
the last two seconds falls below that. Each of those refusals counts too, so an address
that keeps hammering stays held, and one that calms down is let in again within two
seconds. A client that meets a limit now and then (and retries after its
``Retry-After``) never comes near the bound, nor does one over its limit on kept-alive
connections, however many (an SDK's pool: its later requests are not counted, and the
hold turns away only new connections). As nginx's ``limit_req`` and ``limit_conn``, it
is per address: clients behind one NAT share it while one of them hammers;
``server.trusted_proxies`` are never held (their connections carry many clients), and
``max_connections_per_client: 0`` turns it off with the cap.

Counted per server (its listening address) and client address, in this process, with no
IO: pure bookkeeping over a clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

# Refusals within two seconds from which an address is held. Far above what a client
# that honours Retry-After makes, far below what a reconnecting flood makes (hundreds).
HOLD_AFTER = 64
WINDOW_S = 1.0
# Addresses tracked at most; past it the one refused longest ago is forgotten (the memory
# stays bounded however many addresses a flood comes from, and an address that keeps
# being refused is never the one forgotten).
KEPT = 10_000
# The ASGI extension (in a request's ``scope["extensions"]``) that says it is the first
# of its connection, and under which key (server, client address) it counts (set by the
# server, ``http/server.py``, for all but a trusted proxy's): only those refusals count.
NEW_CONNECTION = "memory_gateway.new_connection"


class RefusedAddresses:
    """How often each (server, client address) was refused in the current and the
    previous second."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        # key -> [window number, refusals in it, refusals in the window before]
        self.counts: dict[Hashable, list[int]] = {}

    def _entry(self, key: Hashable) -> list[int] | None:
        entry = self.counts.get(key)
        if entry is None:
            return None
        window = int(self.clock() // WINDOW_S)
        if window != entry[0]:
            previous = entry[1] if window == entry[0] + 1 else 0
            if not previous:
                del self.counts[key]  # nothing in the last second: forgotten
                return None
            entry[:] = [window, 0, previous]
        return entry

    def note(self, key: Hashable) -> None:
        """One more refusal of ``key``."""
        entry = self._entry(key)
        if entry is None:
            if len(self.counts) >= KEPT:
                del self.counts[next(iter(self.counts))]  # the one refused longest ago
            entry = [int(self.clock() // WINDOW_S), 0, 0]
        else:
            del self.counts[key]  # (put back last: the dict's order is by last refusal)
        self.counts[key] = entry
        entry[1] += 1

    def held(self, key: Hashable) -> bool:
        """Whether ``key`` was refused ``HOLD_AFTER`` times in this second and the last."""
        entry = self._entry(key)
        return entry is not None and entry[1] + entry[2] >= HOLD_AFTER


# The process's one record: the app notes its refusals, the server looks before parsing.
REFUSED = RefusedAddresses()
