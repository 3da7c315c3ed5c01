"""The one memo helper of the request path: bounded, keyed by values, never by ``id()``.

Every cache of the gateway is one of these, so that all of them are found by one search
and bounded the same way:

- ``memo(maxsize)``: a function's results, by its arguments (``functools.lru_cache``);
- ``memo_when_short(limit, maxsize)``: the same, for a first argument at most ``limit``
  long only: the request path meets the same texts request after request (a session's
  stored messages, summaries, the new message split into terms), and a pasted document
  is computed each time rather than kept;
- ``BoundedMap`` / ``BoundedSet``: what a caller remembers itself, forgetting the least
  recently written entry first.

A memo is only ever keyed by the values a result is computed from (texts, bytes, numbers,
or an object the entry itself holds, so that its identity cannot be reused while the
entry lives): an entry can be unused, never stale.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar, cast, overload

F = TypeVar("F", bound=Callable[..., Any])
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def memo(*, maxsize: int) -> Callable[[F], F]:
    """A function's results by its (hashable) arguments, the ``maxsize`` most recent kept.
    ``cache_info`` and ``cache_clear`` are ``functools.lru_cache``'s."""

    def decorate(function: F) -> F:
        return cast(F, functools.lru_cache(maxsize=maxsize)(function))

    return decorate


def memo_when_short(*, limit: int, maxsize: int) -> Callable[[F], F]:
    """``memo(maxsize)`` for calls whose first argument is at most ``limit`` long; a longer
    one is computed and not kept. ``cache_info`` and ``cache_clear`` are the memo's."""

    def decorate(function: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize)(function)

        @functools.wraps(function)
        def call(value: str | bytes, *args: Any) -> Any:
            if len(value) > limit:
                return function(value, *args)
            return cached(value, *args)

        call.cache_info = cached.cache_info  # type: ignore[attr-defined]
        call.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        return cast(F, call)

    return decorate


class BoundedMap(Generic[K, V]):
    """A mapping of at most ``size`` entries that forgets the least recently written first."""

    __slots__ = ("_items", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: V) -> V: ...
    def get(self, key: K, default: V | None = None) -> V | None:
        return self._items.get(key, default)

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class BoundedSet(Generic[K]):
    """A set of at most ``size`` members that forgets the least recently added first."""

    __slots__ = ("_items",)

    def __init__(self, size: int) -> None:
        self._items: BoundedMap[K, bool] = BoundedMap(size)

    def add(self, key: K) -> None:
        self._items.put(key, True)

    def __contains__(self, key: K) -> bool:
        return self._items.get(key, False)

    def __len__(self) -> int:
        return len(self._items)
