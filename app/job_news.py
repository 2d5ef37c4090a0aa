"""Wake the long polls waiting on a job as soon as its state changes, from any thread.

A long poll subscribes to its job before it reads the job's state (`News`): every change
from then on is noted, so a change between its read and its wait is never missed, and it
reads the state again only when there is news (no reads on a timer). The embedded worker
thread calls `JobNews.publish(job_id)` after each change (started, per-head stage, progress,
done, failed); Redis mode notes changes through app.queue.job_watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator


class News:
    """The news of one job since this subscription began (or since the last `wait`)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def note(self) -> None:
        """The job changed (call on the subscriber's event loop)."""
        self._event.set()

    def note_threadsafe(self) -> None:
        with contextlib.suppress(RuntimeError):  # its event loop has closed
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, at_most_s: float) -> bool:
        """Whether the job changed since the last wait, waiting up to `at_most_s` for it."""
        if not self._event.is_set() and at_most_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), at_most_s)
        changed = self._event.is_set()
        self._event.clear()
        return changed


class Polled(News):
    """News for a backend that hears of no change: 'maybe changed' after every wait."""

    async def wait(self, at_most_s: float) -> bool:
        await asyncio.sleep(at_most_s)
        return True


@contextlib.asynccontextmanager
async def polled() -> AsyncIterator[News]:
    yield Polled()


class JobNews:
    """Subscriptions per job id, each noted by every `publish` of its job."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: dict[str, set[News]] = {}

    @contextlib.contextmanager
    def _held(self, job_id: str, news: News) -> Iterator[News]:
        with self._lock:
            self._subscribers.setdefault(job_id, set()).add(news)
        try:
            yield news
        finally:
            with self._lock:
                subscribers = self._subscribers.get(job_id, set())
                subscribers.discard(news)
                if not subscribers:
                    self._subscribers.pop(job_id, None)

    @contextlib.asynccontextmanager
    async def subscribe(self, job_id: str) -> AsyncIterator[News]:
        """Note every change of `job_id` from now until the block ends."""
        with self._held(job_id, News()) as news:
            yield news

    async def wait(self, job_id: str, at_most_s: float) -> None:
        """Return at the next change of `job_id`, or after `at_most_s`."""
        async with self.subscribe(job_id) as news:
            await news.wait(at_most_s)

    @property
    def subscribed(self) -> int:
        """How many jobs someone waits on."""
        return len(self._subscribers)

    def publish(self, job_id: str) -> None:
        """Note a change of `job_id` for each of its subscribers (callable from any thread)."""
        with self._lock:
            subscribers = list(self._subscribers.get(job_id, ()))
        for news in subscribers:
            news.note_threadsafe()
