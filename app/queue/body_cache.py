"""A small in-process cache of finished results' response bodies.

Job ids are content hashes, so a finished result never changes: the web tier may keep recent
bodies in memory and skip the Redis round trip on the hot path of cached reads. Bounded in bytes
and in age; an entry never outlives the result's own expiry in Redis.
"""

from __future__ import annotations

import time
from collections import OrderedDict


class BodyCache:
    def __init__(self, max_bytes: int = 64 * 1024 * 1024, max_age_s: float = 60.0) -> None:
        self._max_bytes, self._max_age_s = max_bytes, max_age_s
        self._items: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._bytes = 0

    def get(self, key: str) -> bytes | None:
        item = self._items.get(key)
        if item is None:
            return None
        if time.monotonic() > item[0]:
            self._drop(key)
            return None
        self._items.move_to_end(key)
        return item[1]

    def put(self, key: str, body: bytes, ttl_s: float | None = None) -> None:
        """Keep `body` for at most `max_age_s`, and no longer than `ttl_s` if given."""
        if len(body) > self._max_bytes:
            return
        if key in self._items:
            self._drop(key)
        age = self._max_age_s if ttl_s is None else min(self._max_age_s, ttl_s)
        self._items[key] = (time.monotonic() + age, body)
        self._bytes += len(body)
        while self._bytes > self._max_bytes:
            self._drop(next(iter(self._items)))

    def forget(self, keys: list[str]) -> None:
        """Drop the bodies of `keys` (results pruned from the store)."""
        for key in keys:
            if key in self._items:
                self._drop(key)

    def _drop(self, key: str) -> None:
        _, body = self._items.pop(key)
        self._bytes -= len(body)
