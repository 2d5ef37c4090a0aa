"""The embedded backend's queue of pending jobs, in the order they will run: a fair place for a
job of a client with nothing else queued (ahead of the backlogs, behind earlier such jobs).

The event loop places jobs and reads positions while the worker thread takes the next job, so
every operation holds one lock: a position is never read from a list being changed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class PendingJobs:
    """Queued job ids in run order; safe to use from the event loop and the worker thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._order: list[str] = []
        self._ahead: set[str] = set()  # queued jobs of clients that had nothing else queued

    def __len__(self) -> int:
        with self._lock:
            return len(self._order)

    def place(self, job_id: str, ahead: bool) -> int:
        """Queue `job_id` (ahead of the backlogs if `ahead`); its position."""
        with self._lock:
            if not ahead:
                self._order.append(job_id)
                return len(self._order) - 1
            position = sum(1 for other in self._order if other in self._ahead)
            self._ahead.add(job_id)
            self._order.insert(position, job_id)
            return position

    def pop_next(self) -> str:
        """Take the job at the head of the queue (IndexError when there is none)."""
        with self._lock:
            job_id = self._order.pop(0)
            self._ahead.discard(job_id)
            return job_id

    def take_first(self, wanted: Callable[[str], bool]) -> str | None:
        """Take the first queued job for which `wanted(job_id)` holds (None when none does)."""
        with self._lock:
            for job_id in self._order:
                if wanted(job_id):
                    self._order.remove(job_id)
                    self._ahead.discard(job_id)
                    return job_id
            return None

    def remove(self, job_id: str) -> bool:
        """Take `job_id` off the queue; False when it was not queued."""
        with self._lock:
            if job_id not in self._order:
                return False
            self._order.remove(job_id)
            self._ahead.discard(job_id)
            return True

    def position(self, job_id: str) -> int | None:
        """Where `job_id` waits (0: next), None when it is not queued."""
        with self._lock:
            try:
                return self._order.index(job_id)
            except ValueError:
                return None
