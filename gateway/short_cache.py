"""Results remembered for short arguments only: the request path's content-keyed caches.

The request path meets the same values request after request: a session's stored tail
(the same message bytes, less one or two), its summaries and facts (the same texts), the
new user message (split into terms four times in one turn). Each such function is cached
by the value itself, so an entry can never be stale, only unused; and only for values up
to ``limit`` long, so that a pasted document is computed each time rather than kept.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


def remembered_when_short(*, limit: int, maxsize: int) -> Callable[[F], F]:
    """``functools.lru_cache(maxsize)`` for calls whose first argument is at most ``limit``
    long; a longer one is computed and not kept. ``cache_info`` is the cache's."""

    def decorate(function: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize)(function)

        @functools.wraps(function)
        def call(value: str | bytes, *args: Any) -> Any:
            if len(value) > limit:
                return function(value, *args)
            return cached(value, *args)

        call.cache_info = cached.cache_info  # type: ignore[attr-defined]
        return cast(F, call)

    return decorate
