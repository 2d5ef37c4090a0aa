"""Jobs abandoned by dead workers (SIGKILL, power loss): retried once, then failed with a reason.

RQ would find them only after their job timeout; a missing heartbeat finds them in seconds. Both
the workers (each heartbeat) and the web tier (when polled) run this; a lock with an owner token
makes it once (a reap that outlives its lock stops before its next change and never releases
another's lock), and times are read from Redis (`TIME`), so hosts' clocks need not agree.

A worker killed after taking a job off the queue but before marking it started leaves the job
queued in RQ's intermediate list, which only RQ's maintenance (every 10 minutes) looks at, to
fail it; here it is queued again once it has stayed there STRANDED_AFTER_S.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from redis import Redis
from redis.exceptions import LockError
from redis.lock import Lock
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from model_worker.service.queue.keys import reap_lock_key, result_key, stranded_key
from model_worker.service.queue.redis_values import as_text

log = logging.getLogger(__name__)
#: A live worker moves the job it took off the queue to the started registry within
#: milliseconds; one seen in between for this long belongs to a worker that died there.
STRANDED_AFTER_S = 10.0
#: How long one reap may hold its queue's lock (it checks it still holds it before each change).
REAP_LOCK_S = 30.0


def redis_now(connection: Redis) -> float:
    """Redis's clock (`TIME`), in seconds: the one clock every host reaping a queue shares."""
    seconds, microseconds = connection.time()
    return float(seconds) + float(microseconds) / 1e6


def rq_queue(name: str, connection: Redis) -> Queue:
    """The RQ queue `name` as web and workers both see it (JSON-serialised jobs, no pickle)."""
    return Queue(name, connection=connection, serializer=JSONSerializer)


def fetch_job(job_id: str, connection: Redis) -> Job:
    """The RQ job `job_id`; NoSuchJobError when there is none."""
    return Job.fetch(job_id, connection=connection, serializer=JSONSerializer)


def reap_abandoned(
    queue: Queue,
    live_workers: set[str],
    why: str = "stopped (killed or crashed)",
    results: Redis | None = None,
    stranded_after_s: float = STRANDED_AFTER_S,
) -> list[str]:
    """Hand back the started jobs of `queue` whose worker has no live heartbeat, and the jobs
    stranded before they started; their ids.

    RQ's own cleanup then re-enqueues a started job that has a retry left, or fails it (saying
    the worker `why`); a stranded job is queued again (see requeue_stranded). A job whose result
    is already stored (in `results`, else the queue's Redis) is done: it is dropped, never run
    again.
    """
    connection = queue.connection
    lock = connection.lock(
        reap_lock_key(queue.name), timeout=REAP_LOCK_S, blocking=False, thread_local=False
    )
    if not lock.acquire():
        return []
    registry = queue.started_job_registry
    reaped: list[str] = []
    try:
        for member in connection.zrange(registry.key, 0, -1):
            if not lock.owned():  # outlived its lock: another reap may run now
                break
            entry = as_text(member)
            job_id = registry.parse_job_id(entry)
            try:
                job = fetch_job(job_id, connection)
                # status and worker from one read: refreshing the status alone could pair a
                # live worker's "started", written since, with the worker read before it (none)
                status = job.get_status(refresh=False)
            except Exception as exc:  # gone meanwhile, or a malformed record: not ours to judge
                log.info("reaper skipped job %s: %s", job_id[:100], exc)
                continue
            if status != JobStatus.STARTED or job.worker_name in live_workers:
                continue
            if (results or connection).exists(result_key(job_id)):  # finished before it went
                job.delete()
                continue
            if not job.retries_left:
                job.meta["error"] = (
                    f"the worker running this job ({job.worker_name}) {why}, "
                    "and so did the retry; giving up"
                )
                job.save_meta()
            log.warning("job %s abandoned by dead worker %s", job_id, job.worker_name)
            connection.zadd(registry.key, {entry: 0}, xx=True)
            reaped.append(job_id)
        if reaped:
            registry.cleanup(timestamp=0)
        if lock.owned():
            reaped += requeue_stranded(queue, results or connection, stranded_after_s, lock)
    finally:
        with contextlib.suppress(LockError):  # expired, maybe taken by another: theirs now
            lock.release()
    return reaped


def requeue_stranded(
    queue: Queue, results: Redis, after_s: float, lock: Lock | None = None
) -> list[str]:
    """Queue again (at the front) the jobs that every reap for `after_s` seconds saw in `queue`'s
    intermediate list; their ids. A live worker's job leaves that list, marked started, within
    milliseconds of being taken; one killed in between leaves it there, still queued (and maybe
    in the started registry, which RQ's cleanup then skips: it was never marked started). Each
    first sighting is kept in a hash (Redis's time: hosts' clocks may differ), and dropped as
    soon as a reap no longer sees the job. With `lock`, stops once it no longer holds it."""
    connection = queue.connection
    waiting = dict.fromkeys(
        as_text(m) for m in connection.lrange(queue.intermediate_queue_key, 0, -1)
    )
    seen_key = stranded_key(queue.name)
    seen = {as_text(job_id): _seconds(at) for job_id, at in connection.hgetall(seen_key).items()}
    if gone := [job_id for job_id in seen if job_id not in waiting]:
        connection.hdel(seen_key, *gone)
    now = redis_now(connection)
    requeued: list[str] = []
    for job_id in waiting:
        if lock is not None and not lock.owned():
            break
        first = seen.get(job_id)
        if first is None or not now - first >= 0:  # new, or a bad record (NaN, in the future)
            connection.hset(seen_key, job_id, now)
            continue
        if now - first < after_s:
            continue
        connection.hdel(seen_key, job_id)
        if _requeue(queue, job_id, results):
            requeued.append(job_id)
        # only then out of the list: a reaper killed in between leaves the job to the next one
        connection.lrem(queue.intermediate_queue_key, 1, job_id)
    return requeued


def _requeue(queue: Queue, job_id: str, results: Redis) -> bool:
    """Queue `job_id` again, without its dead worker's entry in the started registry, if it
    still waits to start; False when it is gone, finished (its result stored: dropped), was
    started after all, or is already back on the queue."""
    try:
        job = fetch_job(job_id, queue.connection)
        status = job.get_status(refresh=False)  # as fetched a moment ago
    except Exception as exc:  # gone meanwhile, or a malformed record: nothing to run
        log.info("stranded job %s dropped: %s", job_id[:100], exc)
        return False
    if results.exists(result_key(job_id)):
        job.delete()
        return False
    if status != JobStatus.QUEUED or job.get_position() is not None:
        return False
    registry = queue.started_job_registry
    entries = [as_text(member) for member in queue.connection.zrange(registry.key, 0, -1)]
    if mine := [entry for entry in entries if registry.parse_job_id(entry) == job_id]:
        queue.connection.zrem(registry.key, *mine)
    queue.enqueue_job(job, at_front=True)
    log.warning("job %s was taken off the queue by a worker that died: queued again", job_id)
    return True


def _seconds(value: Any) -> float:
    """A stored sighting time; NaN (read as a bad record) when it is not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")
