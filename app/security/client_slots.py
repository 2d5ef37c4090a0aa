"""Concurrent things per client (open connections, long polls), each client at most `limit`.

Every caller runs on the server's event loop (protocol callbacks, route handlers), so plain
counters need no lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager


class ClientSlots:
    """At most `limit` slots held at once per client key."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: Counter[str] = Counter()

    def held(self, key: str) -> int:
        return self._held[key]

    def take(self, key: str) -> bool:
        """Take one of `key`'s slots; False (nothing taken) when it holds them all."""
        if self._held[key] >= self.limit:
            return False
        self._held[key] += 1
        return True

    def give_back(self, key: str) -> None:
        self._held[key] -= 1
        if self._held[key] <= 0:
            del self._held[key]

    @contextmanager
    def slot(self, key: str) -> Iterator[bool]:
        """Hold one of `key`'s slots for the block; yields False (and holds none) when full."""
        taken = self.take(key)
        try:
            yield taken
        finally:
            if taken:
                self.give_back(key)
