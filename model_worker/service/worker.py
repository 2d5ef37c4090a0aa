"""`icl-heads worker`: serve one loaded model's queues through RQ until stopped: its
interactive queue (analyses, patches) first, then its batch queue (experiments, in chunks:
model_worker.service.chunks).

RQ's SimpleWorker (model_worker.service.rq_worker, the one module using RQ's internals) runs each
job in this process (no fork after CUDA is initialised, so the model stays loaded). A heartbeat
thread publishes the model id and weights fingerprint every `worker_heartbeat_s` and hands
back jobs left behind by dead workers. SIGTERM or Ctrl-C: the current job finishes, then the
worker leaves (a second signal stops it at once).

Redis going away (a restart, even one that lost everything) does not stop the worker: a job's
result waits for Redis (model_worker.service.jobs), and when RQ's own bookkeeping fails, RQ's work
loop quits; the worker then waits for Redis with backoff, settles the job it was running (finished:
dropped from the registries; else handed back: retried once, or failed with the reason; lost
with the data: enqueued again) and serves again under the same name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid

from redis import Redis
from redis.exceptions import RedisError
from rq.exceptions import NoSuchJobError, StopRequested
from rq.job import Job, JobStatus

from model_worker.common.settings import Settings
from model_worker.model.loading import LoadedModel
from model_worker.model.prompting import token_limit
from model_worker.service.jobs import STATE, serve_model
from model_worker.service.queue.heartbeats import WorkerBeat, live_beats, remove_beat, write_beat
from model_worker.service.queue.keys import (
    interactive_queue_name,
    queue_name,
    result_key,
    tokenizer_key,
)
from model_worker.service.queue.reaper import fetch_job, reap_abandoned, rq_queue
from model_worker.service.queue.signing import result_signer
from model_worker.service.rq_worker import RqWorker, no_retry_after_exception

log = logging.getLogger(__name__)
#: Longest pause between two attempts to reach Redis again.
MAX_RECONNECT_S = 5.0
LOST_REDIS = "lost its connection to Redis"


def redis_for_worker(url: str) -> Redis:
    """A connection that tolerates the worker's long blocking dequeue, and reconnects."""
    return Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)


class ModelWorker:
    """Serves `loaded` on its model's queue, heartbeating until stopped."""

    def __init__(
        self,
        loaded: LoadedModel,
        settings: Settings,
        connection: Redis,
        *,
        device: str = "",
        name: str | None = None,
    ) -> None:
        self.loaded = loaded
        self.settings = settings
        self.connection = connection
        #: where results go: the cache (ICL_CACHE_REDIS_URL) or the queue's Redis
        self.results = (
            redis_for_worker(settings.cache_redis_url) if settings.cache_redis_url else connection
        )
        self.name = name or f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
        self.queue = rq_queue(queue_name(loaded.name), connection)
        #: served first: analyses and patches never wait behind an experiment's chunks
        self.interactive = rq_queue(interactive_queue_name(loaded.name), connection)
        self.beat = WorkerBeat(
            name=self.name,
            model=loaded.name,
            fingerprint=loaded.fingerprint,
            queue=self.queue.name,
            device=device or str(loaded.device),
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=time.time(),
            max_prompt_tokens=token_limit(loaded, settings.max_prompt_tokens),
            n_layers=loaded.geometry.n_layers,
            n_heads=loaded.geometry.n_heads,
        )
        self._stop = threading.Event()
        # serialised now: the heartbeat thread must not touch the tokenizer while a job uses it
        # (a fast tokenizer used from two threads at once raises "Already borrowed")
        backend = getattr(loaded.tokenizer, "backend_tokenizer", None)
        self._tokenizer_json: str | None = None if backend is None else backend.to_str()

    def heartbeat(self) -> None:
        """Publish this worker's beat, then hand back jobs whose worker stopped beating."""
        beat = self.beat.model_copy(
            update={
                "jobs_done": STATE.jobs_done,
                "mean_job_s": STATE.mean_job_s,
                "current_job": STATE.current_job,
            }
        )
        write_beat(self.connection, beat, self.settings.worker_heartbeat_s)
        self._publish_tokenizer()
        live = {other.name for other in live_beats(self.connection)}
        for queue in (self.interactive, self.queue):
            reap_abandoned(queue, live, results=self.results)

    def _publish_tokenizer(self) -> None:
        """Share the tokenizer (once per fingerprint, again after Redis lost it), so the web
        tier refuses too-long prompts at once."""
        key = tokenizer_key(self.loaded.fingerprint)
        if self._tokenizer_json and self.loaded.fingerprint and not self.connection.exists(key):
            self.connection.set(key, self._tokenizer_json, ex=self.settings.result_ttl_s)

    def _beat_forever(self) -> None:
        while not self._stop.wait(self.settings.worker_heartbeat_s):
            try:
                self.heartbeat()
            except RedisError as exc:  # Redis restarting: keep trying, the beat comes back
                log.warning("heartbeat failed: %s", exc)
            except Exception:  # never let a bug silence the beat: the worker would look dead
                log.exception("heartbeat failed")

    def run(self, burst: bool = False) -> None:
        """Serve jobs until SIGTERM/SIGINT (or, with `burst`, until the queue is empty)."""
        if not result_signer(self.settings).configured:  # (short keys raise here, at start)
            log.warning(
                "ICL_RESULT_KEYS is not set: results are signed with the development key, and "
                "anyone able to write to Redis can forge them (docs/deployment.md)"
            )
        serve_model(self.loaded, self.settings, self.results)
        self.heartbeat()
        beating = threading.Thread(target=self._beat_forever, name="icl-heartbeat", daemon=True)
        beating.start()
        log.info("worker %s serves %s on queue %s", self.name, self.loaded.name, self.queue.name)
        try:
            self._serve(burst)
        finally:
            self._stop.set()
            beating.join(timeout=5)
            try:
                remove_beat(self.connection, self.name)
            except RedisError as exc:
                log.warning("could not remove the heartbeat: %s", exc)

    def _serve(self, burst: bool) -> None:
        """RQ's work loop, started again (same name) each time it breaks off on Redis."""
        while True:
            worker = RqWorker(
                [self.interactive.name, self.queue.name],  # in this order: interactive first
                connection=self.connection,
                name=self.name,
                serializer=self.queue.serializer,
                exception_handlers=[no_retry_after_exception],
            )
            try:
                worker.work(burst=burst, with_scheduler=False, logging_level="INFO")
            except RedisError as exc:  # RQ's start or teardown could not reach Redis
                log.warning("worker loop: %s", exc)
            if worker.stopping or (burst and worker.drained and worker.running is None):
                return
            log.warning("lost Redis: reconnecting, then serving again")
            worker.close_pubsub()
            try:
                self._wait_for_redis(worker)
                self._settle(worker.running)
            except StopRequested:  # SIGTERM while reconnecting
                return

    def _wait_for_redis(self, worker: RqWorker) -> None:
        """Block until Redis answers (backoff up to MAX_RECONNECT_S); then clear RQ's stale
        registration of this worker and announce it again."""
        pause = 0.5
        while not worker.stopping:
            time.sleep(pause)
            try:
                self.connection.delete(worker.key)
                self.heartbeat()
                return
            except RedisError as exc:
                log.warning("Redis unreachable (%s); retrying in %.2g s", exc, pause)
                pause = min(MAX_RECONNECT_S, pause * 2)
        raise StopRequested()

    def _settle(self, job: Job | None) -> None:
        """The job running when Redis went: dropped if its result is stored, handed back if it
        had started (retried once, else failed with the reason), queued again if it had not,
        enqueued again if Redis lost it: never lost silently."""
        if job is None:
            return
        if self.results.exists(result_key(job.id)):
            _drop(job.id, self.connection)
            log.info("job %s finished while Redis was away; its result is stored", job.id)
            return
        try:
            stored = fetch_job(job.id, self.connection)
        except NoSuchJobError:
            lost = self.interactive if job.origin == self.interactive.name else self.queue
            lost.enqueue_job(job)
            log.warning("job %s was lost with Redis's data: enqueued again", job.id)
            return
        status = stored.get_status()
        queue = self.interactive if stored.origin == self.interactive.name else self.queue
        if status == JobStatus.QUEUED and stored.get_position() is None:
            self.connection.lrem(queue.intermediate_queue_key, 0, job.id)
            queue.enqueue_job(stored)  # taken off the queue, never started
            log.warning("job %s queued again after losing Redis", job.id)
        elif status == JobStatus.STARTED:
            live = {beat.name for beat in live_beats(self.connection)} - {self.name}
            for _ in range(40):  # another reaper may hold the lock for a moment
                if job.id in reap_abandoned(queue, live, LOST_REDIS, self.results):
                    log.warning("job %s handed back after losing Redis", job.id)
                    return
                time.sleep(0.25)
            log.error("could not hand back job %s", job.id)


def _drop(job_id: str, connection: Redis) -> None:
    with contextlib.suppress(NoSuchJobError):
        fetch_job(job_id, connection).delete()
