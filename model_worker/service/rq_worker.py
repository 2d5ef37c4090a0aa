"""The RQ worker class: the one module that uses RQ beyond its public API.

RQ's SimpleWorker runs each job in this process. `RqWorker` adds what this project needs:
it refuses any job that is not one of ours (model_worker.service.job_policy) and fails it with the
reason, remembers the job it was running when its work loop broke off, and whether the loop
ended because the queue was empty. Doing so touches RQ's private names (listed below and
checked against the installed RQ by tests/unit/test_rq_pin.py); nothing else in app/ or
model_worker/ does. pyproject.toml pins RQ to the major version tested here.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable
from typing import Any

from redis.exceptions import RedisError
from rq.exceptions import DequeueTimeout, InvalidJobOperation
from rq.job import Job
from rq.queue import Queue
from rq.utils import as_text
from rq.worker import SimpleWorker

from model_worker.service.job_policy import refusal

log = logging.getLogger(__name__)
#: The RQ major version this module was written and tested against (pyproject.toml pins it).
TESTED_RQ_MAJOR = 3
#: RQ's private names used below: a method and two attributes of its workers, and what a
#: job stores as the dotted names of its callbacks.
PRIVATE_WORKER_NAMES = ("_finalize_failure", "_shutdown_requested_date", "_stop_requested")
#: RQ's private queue method used by PriorityQueues (turns a dequeued id into its job).
PRIVATE_QUEUE_NAMES = ("_fetch_dequeued_job",)
PRIVATE_JOB_NAMES = ("_success_callback_name", "_failure_callback_name", "_stopped_callback_name")


class JobRefused(Exception):
    """A job that is not one of this project's (see model_worker.service.job_policy)."""


def no_retry_after_exception(job: Any, *_exc_info: Any) -> bool:
    """An exception inside a job fails that job: retries are for workers that died."""
    job.retries_left = 0
    return True


def disarm(job: Job) -> None:
    """Drop everything a refused job would make RQ call on failure (callbacks, webhooks, retry)."""
    for name in PRIVATE_JOB_NAMES:
        setattr(job, name, None)
    job.webhooks = []
    job.retries_left = 0


class PriorityQueues(Queue):
    """RQ's Queue, taking jobs from several queues in their order (interactive first) with
    LMOVE, as RQ does for one queue: each job taken passes through its queue's intermediate
    list, so one whose worker died between taking and starting it is found and queued again
    (model_worker.service.queue.reaper), where RQ's own LPOP over several queues loses it.
    While every queue is empty it blocks on the first for up to BLOCK_S at a time."""

    BLOCK_S = 1

    @classmethod
    def dequeue_any(
        cls,
        queues: Iterable[Queue],
        timeout: int | None,
        connection: Any,
        job_class: Any = None,
        serializer: Any = None,
        death_penalty_class: Any = None,
    ) -> tuple[Job, Queue] | None:
        ordered = list(queues)
        deadline = None if timeout is None else time.monotonic() + timeout
        options = {
            "job_class": job_class,
            "serializer": serializer,
            "death_penalty_class": death_penalty_class,
        }
        while True:
            for queue in ordered:
                found = cls._fetched(connection, cls.lmove(connection, queue.key, None), options)
                if found is not None:
                    return found
            if deadline is None:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise DequeueTimeout(timeout, ordered[0].key)
            try:
                taken = cls.lmove(connection, ordered[0].key, max(1, min(cls.BLOCK_S, int(left))))
            except DequeueTimeout:
                continue
            found = cls._fetched(connection, taken, options)
            if found is not None:
                return found

    @classmethod
    def _fetched(
        cls, connection: Any, taken: Any, options: dict[str, Any]
    ) -> tuple[Job, Queue] | None:
        """The job an LMOVE took (None: nothing taken, or a job gone meanwhile)."""
        if taken is None:
            return None
        queue_key, job_id = as_text(taken[0]), as_text(taken[1])
        found: tuple[Job, Queue] | None = cls._fetch_dequeued_job(
            connection, queue_key, job_id, **options
        )
        return found


class RqWorker(SimpleWorker):
    """RQ's SimpleWorker, remembering the job it was running when its work loop broke off and
    whether the loop ended because the queue was empty (burst mode); it runs only this project's
    job functions and fails any other job with the reason, without importing anything of it."""

    running: Job | None = None
    drained = False
    queue_class = PriorityQueues

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        """RQ's bookkeeping before a job runs; the job always leaves its queue's intermediate
        list (PriorityQueues passes every job through it, also with several queues)."""
        super().prepare_job_execution(job, remove_from_intermediate_queue=True)

    def perform_job(self, job: Job, queue: Any, execution: Any) -> bool:
        reason = refusal(job)
        if reason is None:
            return bool(super().perform_job(job, queue, execution))
        log.error("refused job %s from queue %s: %s", job.id, queue.name, reason)
        disarm(job)
        job.meta["error"] = f"refused by the worker: {reason}"
        try:
            job.save_meta()
            self.prepare_job_execution(job, remove_from_intermediate_queue=len(self.queues) == 1)
            raise JobRefused(reason)
        except Exception:
            self._finalize_failure(job, queue, execution, sys.exc_info())
        return False

    def handle_job_success(
        self, job: Job, queue: Any, started_job_registry: Any, execution: Any
    ) -> None:
        """RQ's bookkeeping of a finished job; when Redis lost the job's data meanwhile (a
        restart, a flush) there is nothing left to record, and the job must not be failed for
        it: its stored request is enqueued again (app.queue.redis_backend) or its result kept."""
        try:
            super().handle_job_success(
                job=job, queue=queue, started_job_registry=started_job_registry, execution=execution
            )
        except InvalidJobOperation:
            if self.connection.exists(job.key):
                raise
            log.warning("job %s finished after Redis lost its data: nothing to record", job.id)

    def execute_job(self, job: Job, queue: Any) -> None:
        self.running = job
        super().execute_job(job, queue)
        self.running = None

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> Any:
        result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        self.drained = result is None
        return result

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's worker heartbeat; on its own (not in a pipeline) a Redis error is only logged,
        so a job just taken off the queue reaches execute_job and is settled if cut off."""
        if pipeline is not None:
            return super().heartbeat(timeout, pipeline)
        try:
            super().heartbeat(timeout)
        except RedisError as exc:
            log.warning("RQ heartbeat failed: %s", exc)

    @property
    def stopping(self) -> bool:
        """SIGTERM/SIGINT received (RQ records when)."""
        return self._shutdown_requested_date is not None or self._stop_requested

    def close_pubsub(self) -> None:
        """Stop the command-channel thread of a work loop that broke off (a new one subscribes)."""
        thread = getattr(self, "pubsub_thread", None)
        if thread is not None:
            thread.stop()
