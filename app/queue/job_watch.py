"""Long polls over Redis as a subscription: one watcher per web process instead of a loop of
full status reads per poll.

While any long poll waits, one task reads a small mark of every job waited on — its RQ
status, meta (progress, message) and queue's length, whether its result and its per-head
stage exist — all in one pipeline on the event loop (no thread of the shared pool) every
TICK_S, and wakes the waiters of each job whose mark changed. A thousand polls of one job
cost one mark read per tick; a poll reads the job's whole status only when woken (or, as a
safety net, once per `app.job_wait.REREAD_S`). Redis unreachable: every waiter is woken (its
status read then answers 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError
from rq import Queue
from rq.job import Job

from model_worker.queue.keys import heads_stage_key, result_key

#: Seconds between two reads of the marks of the jobs waited on.
TICK_S = 0.05
log = logging.getLogger(__name__)
Mark = tuple[Any, ...]


def _wake(futures: set[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)


class JobWatch:
    """Waiters per job id, woken when the job's mark in Redis changes."""

    def __init__(self, redis: AsyncRedis, tick_s: float = TICK_S) -> None:
        self._redis = redis
        self._tick_s = tick_s
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._marks: dict[str, Mark] = {}
        self._queues: dict[str, str] = {}  # job -> its queue's list key, once read
        self._task: asyncio.Task[None] | None = None

    @property
    def watched(self) -> int:
        """How many jobs some poll waits on."""
        return len(self._waiters)

    async def wait(self, job_id: str, at_most_s: float) -> None:
        """Return at the next change of `job_id`'s mark, or after `at_most_s`."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiters.setdefault(job_id, set()).add(future)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._watch())
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, at_most_s)
        finally:
            waiting = self._waiters.get(job_id)
            if waiting is not None:
                waiting.discard(future)
                if not waiting:
                    del self._waiters[job_id]
                    self._marks.pop(job_id, None)
                    self._queues.pop(job_id, None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self) -> None:
        """Read the marks every tick while anyone waits; wake the waiters of changed jobs."""
        while self._waiters:
            ids = list(self._waiters)
            try:
                marks: dict[str, Mark] | None = await self._read(ids)
            except (RedisError, OSError) as exc:
                log.debug("job marks unreadable (%s): waking every long poll", exc)
                marks = None
            for job_id in ids:
                waiting = self._waiters.get(job_id)
                if not waiting:
                    continue
                if marks is None:
                    _wake(waiting)
                    continue
                before = self._marks.get(job_id)
                self._marks[job_id] = marks[job_id]
                if before is not None and before[-1] is not None and before != marks[job_id]:
                    _wake(waiting)  # (a mark read before its queue was known is no baseline)
            await asyncio.sleep(self._tick_s)

    async def _read(self, ids: list[str]) -> dict[str, Mark]:
        """Each job's mark, in one pipeline."""
        queues = dict(self._queues)
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hmget(Job.key_for(job_id), ["status", "meta", "origin"])
                pipe.exists(result_key(job_id))
                pipe.exists(heads_stage_key(job_id))
                pipe.llen(queues.get(job_id, "icl:no-queue"))
            replies = await pipe.execute()
        marks: dict[str, Mark] = {}
        for n, job_id in enumerate(ids):
            (status, meta, origin), done, heads, queued = replies[4 * n : 4 * n + 4]
            if origin is not None and job_id not in self._queues:
                name = origin.decode() if isinstance(origin, bytes) else str(origin)
                self._queues[job_id] = Queue.redis_queue_namespace_prefix + name
            marks[job_id] = (status, meta, done, heads, queued if job_id in queues else None)
        return marks
