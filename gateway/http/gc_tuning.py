"""Python's cyclic garbage collector, set for a process that serves requests.

A request allocates thousands of short-lived objects (parsed JSON, messages, plans),
nearly all freed by reference counting the moment the request ends; the collector only
has cycles left to find. With CPython's default thresholds (700, 10, 10) it still ran
about 70 young collections a second at 480 req/s, and a full collection, which walks
every object the process holds (modules, the app, its caches), every 2 seconds: 10% of
the gateway's CPU under load, and 70 ms at a time for each full one (docs/decisions.md).
"""

from __future__ import annotations

import gc

# Young collections every 10,000 net allocations; each older generation after 20 of the
# younger (cycles still found, within seconds, not never).
THRESHOLDS = (10_000, 20, 20)


def tune_for_serving() -> None:
    """Call once at start-up: what exists now (imports, the app) is kept for the life of
    the process, so it is moved out of the collector's sight, and collections are made
    rarer."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
