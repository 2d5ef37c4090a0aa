"""A small most-recently-used memo for the views of finished jobs: a job id names a result that
never changes, so what a page builds from it (a panel and its figures) can be kept and served
again without building it anew. Used from the event loop only (no locking)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class Recent(Generic[V]):
    """The last `size` values made, by key; `made(key, make)` makes a missing one."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[Hashable, V] = OrderedDict()

    def made(self, key: Hashable, make: Callable[[], V]) -> V:
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        value = make()
        self._items[key] = value
        while len(self._items) > self._size:
            self._items.popitem(last=False)
        return value
