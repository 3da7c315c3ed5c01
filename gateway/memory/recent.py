"""Bounded memories of recent keys: prefetch hints kept by a process, never data."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar, overload

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Recent(Generic[K, V]):
    """A bounded mapping that forgets the least recently written entry first."""

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


class RecentSet(Generic[K]):
    """A bounded set that forgets the least recently added member first."""

    def __init__(self, size: int) -> None:
        self._items: Recent[K, bool] = Recent(size)

    def add(self, key: K) -> None:
        self._items.put(key, True)

    def __contains__(self, key: K) -> bool:
        return self._items.get(key, False)
