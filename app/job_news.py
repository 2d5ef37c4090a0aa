"""Wake the long polls waiting on a job as soon as its state changes, from any thread.

The embedded worker thread calls `publish(job_id)` after each change (started, per-head stage,
progress, done, failed); a long poll awaits `wait(job_id, at_most_s)` between two status reads
instead of sleeping a fixed interval, so it answers within microseconds of the change. A
change between a poll's status read and its `wait` is seen at the latest after `at_most_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class JobNews:
    """Waiters per job id, each woken once by the next `publish` of its job."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}

    async def wait(self, job_id: str, at_most_s: float) -> None:
        """Return at the next change of `job_id`, or after `at_most_s`."""
        future = asyncio.get_running_loop().create_future()
        with self._lock:
            self._waiters.setdefault(job_id, []).append(future)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, at_most_s)
        finally:
            with self._lock:
                waiting = self._waiters.get(job_id, [])
                if future in waiting:
                    waiting.remove(future)
                if not waiting:
                    self._waiters.pop(job_id, None)

    def publish(self, job_id: str) -> None:
        """Wake every waiter of `job_id` (callable from any thread)."""
        with self._lock:
            woken = self._waiters.pop(job_id, [])
        for future in woken:
            with contextlib.suppress(RuntimeError):  # its event loop has closed
                future.get_loop().call_soon_threadsafe(_wake, future)
