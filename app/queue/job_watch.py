"""Long polls over Redis as a subscription: one watcher per web process instead of a loop of
full status reads per poll.

A poll subscribes to its job (`subscribe`) before it reads the job's state; the job's mark —
its RQ status, meta (progress, message) and queue's length, whether its result and its
per-head stage exist (MARKS_LUA) — is read at once as the baseline if no other poll holds
one. While any poll is subscribed, one task reads the marks of every job subscribed to, all
in one script call on the event loop (no thread of the shared pool) every TICK_S, and notes
the news of each job whose mark changed. A thousand polls of one job cost one mark read per
tick; a poll reads the job's whole status only when there is news, never on a timer. Redis
unreachable: every subscription gets news (its status read then answers 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError
from rq import Queue
from rq.job import Job

from app.job_news import News
from model_worker.service.queue.keys import heads_stage_key, result_key

#: Seconds between two reads of the marks of the jobs waited on.
TICK_S = 0.05
log = logging.getLogger(__name__)
Mark = Any  # (bytes from Redis: only compared)


def _note(subscribers: set[News]) -> None:
    for news in subscribers:
        news.note()


class JobWatch:
    """Subscriptions per job id, noted when the job's mark in Redis changes."""

    def __init__(self, redis: AsyncRedis, tick_s: float = TICK_S) -> None:
        self._redis = redis
        self._tick_s = tick_s
        self._subscribers: dict[str, set[News]] = {}
        self._marks: dict[str, Mark] = {}
        self._marks_script = redis.register_script(MARKS_LUA)
        self._task: asyncio.Task[None] | None = None
        self._baselines: dict[str, asyncio.Future[None]] = {}  # baseline reads under way
        self.mark_reads = 0  # pipelines sent (ticks and baselines), for tests and benchmarks

    @property
    def watched(self) -> int:
        """How many jobs some poll waits on."""
        return len(self._subscribers)

    @contextlib.asynccontextmanager
    async def subscribe(self, job_id: str) -> AsyncIterator[News]:
        """Note every change of `job_id`'s mark from now until the block ends."""
        news = News()
        self._subscribers.setdefault(job_id, set()).add(news)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())
        try:
            if job_id not in self._marks:  # the baseline: changes after it are news
                reading = self._baselines.get(job_id)
                if reading is None:  # one read for every poll that subscribes meanwhile
                    reading = asyncio.ensure_future(self._baseline(job_id))
                    self._baselines[job_id] = reading
                try:
                    await asyncio.shield(reading)
                except (RedisError, OSError) as exc:
                    log.debug("job mark unreadable (%s)", exc)
                    news.note()
            yield news
        finally:
            subscribers = self._subscribers.get(job_id)
            if subscribers is not None:
                subscribers.discard(news)
                if not subscribers:
                    del self._subscribers[job_id]
                    self._marks.pop(job_id, None)

    async def _baseline(self, job_id: str) -> None:
        try:
            mark = (await self._read([job_id]))[job_id]
            if job_id in self._subscribers:  # (else every poll of it left meanwhile)
                self._marks.setdefault(job_id, mark)
        finally:
            self._baselines.pop(job_id, None)

    async def wait(self, job_id: str, at_most_s: float) -> None:
        """Return at the next change of `job_id`'s mark, or after `at_most_s`."""
        async with self.subscribe(job_id) as news:
            await news.wait(at_most_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self) -> None:
        """Read the marks every tick while anyone waits; note the news of changed jobs."""
        while self._subscribers:
            await asyncio.sleep(self._tick_s)
            ids = list(self._subscribers)
            if not ids:
                break
            try:
                marks: dict[str, Mark] | None = await self._read(ids)
            except (RedisError, OSError) as exc:
                log.debug("job marks unreadable (%s): news for every long poll", exc)
                marks = None
            for job_id in ids:
                subscribers = self._subscribers.get(job_id)
                if not subscribers:
                    continue
                if marks is None:
                    _note(subscribers)
                    continue
                before = self._marks.get(job_id)
                self._marks[job_id] = marks[job_id]
                if before is not None and before != marks[job_id]:
                    _note(subscribers)

    async def _read(self, ids: list[str]) -> dict[str, Mark]:
        """Each job's mark, computed in Redis by one script call (a pipeline of four commands
        a job cost ~2 ms of the event loop per tick for ten jobs, encoding and parsing; the
        script's reply is one short string a job)."""
        self.mark_reads += 1
        keys = [key for job_id in ids for key in (Job.key_for(job_id), *_side_keys(job_id))]
        marks = await self._marks_script(keys=keys, args=[Queue.redis_queue_namespace_prefix])
        return dict(zip(ids, marks, strict=True))


def _side_keys(job_id: str) -> tuple[str, str]:
    return result_key(job_id), heads_stage_key(job_id)


#: A job's mark: its RQ status, a hash of its meta (progress, message), whether its result and
#: its per-head stage exist, and its queue's name and length ("position" news).
MARKS_LUA = """
local out = {}
for i = 1, #KEYS, 3 do
  local job = redis.call('HMGET', KEYS[i], 'status', 'meta', 'origin')
  local meta, queued = '', ''
  if job[2] then meta = redis.sha1hex(job[2]) end
  if job[3] then queued = job[3] .. ':' .. redis.call('LLEN', ARGV[1] .. job[3]) end
  out[#out + 1] = (job[1] or '') .. '|' .. meta .. '|' .. redis.call('EXISTS', KEYS[i + 1])
    .. redis.call('EXISTS', KEYS[i + 2]) .. '|' .. queued
end
return out
"""
