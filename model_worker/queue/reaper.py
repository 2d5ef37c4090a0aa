"""Jobs abandoned by dead workers (SIGKILL, power loss): retried once, then failed with a reason.

RQ would find them only after their job timeout; a missing heartbeat finds them in seconds. Both
the workers (each heartbeat) and the web tier (when polled) run this; a lock makes it once.
"""

from __future__ import annotations

import logging

from redis import Redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from model_worker.queue.keys import reap_lock_key, result_key

log = logging.getLogger(__name__)


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
) -> list[str]:
    """Hand back the started jobs of `queue` whose worker has no live heartbeat; their ids.

    RQ's own cleanup then re-enqueues a job that has a retry left, or fails it (saying the worker
    `why`). A job whose result is already stored (in `results`, else the queue's Redis) is
    done: it is dropped, never run again.
    """
    connection = queue.connection
    if not connection.set(reap_lock_key(queue.name), 1, nx=True, ex=2):
        return []
    registry = queue.started_job_registry
    reaped: list[str] = []
    try:
        for member in connection.zrange(registry.key, 0, -1):
            entry = member.decode() if isinstance(member, bytes) else str(member)
            job_id = registry.parse_job_id(entry)
            try:
                job = fetch_job(job_id, connection)
                status = job.get_status()
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
    finally:
        connection.delete(reap_lock_key(queue.name))
    return reaped
