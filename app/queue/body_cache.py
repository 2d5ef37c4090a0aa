"""A small in-process cache of finished results' response bodies.

Job ids are content hashes, so a finished result never changes: the web tier may keep recent
bodies in memory and skip the Redis round trip on the hot path of cached reads. Bounded in bytes
and in age (a result that expired in Redis is served at most `max_age_s` longer).
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
        if time.monotonic() - item[0] > self._max_age_s:
            self._drop(key)
            return None
        self._items.move_to_end(key)
        return item[1]

    def put(self, key: str, body: bytes) -> None:
        if len(body) > self._max_bytes:
            return
        if key in self._items:
            self._drop(key)
        self._items[key] = (time.monotonic(), body)
        self._bytes += len(body)
        while self._bytes > self._max_bytes:
            self._drop(next(iter(self._items)))

    def _drop(self, key: str) -> None:
        _, body = self._items.pop(key)
        self._bytes -= len(body)
