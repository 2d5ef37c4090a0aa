"""`icl-heads worker`: serve one loaded model's queue through RQ until stopped.

RQ's SimpleWorker runs each job in this process (no fork after CUDA is initialised, so the
model stays loaded). A heartbeat thread publishes the model id and weights fingerprint every
`worker_heartbeat_s` and hands back jobs left behind by dead workers. SIGTERM or Ctrl-C: the
current job finishes, then the worker leaves (a second signal stops it at once).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from redis import Redis
from redis.exceptions import RedisError
from rq.worker import SimpleWorker

from app.keys import queue_name
from app.queue.heartbeats import WorkerBeat, live_beats, remove_beat, write_beat
from app.queue.reaper import reap_abandoned, rq_queue
from app.settings import Settings
from model_worker.jobs import STATE, serve_model
from model_worker.loading import LoadedModel

log = logging.getLogger(__name__)


def _no_retry_after_exception(job: Any, *_exc_info: Any) -> bool:
    """An exception inside a job fails that job: retries are for workers that died."""
    job.retries_left = 0
    return True


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
        self.name = name or f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
        self.queue = rq_queue(queue_name(loaded.name), connection)
        self.beat = WorkerBeat(
            name=self.name,
            model=loaded.name,
            fingerprint=loaded.fingerprint,
            queue=self.queue.name,
            device=device or str(loaded.device),
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=time.time(),
        )
        self._stop = threading.Event()

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
        live = {other.name for other in live_beats(self.connection)}
        reap_abandoned(self.queue, live)

    def _beat_forever(self) -> None:
        while not self._stop.wait(self.settings.worker_heartbeat_s):
            try:
                self.heartbeat()
            except RedisError as exc:  # Redis restarting: keep trying, the beat comes back
                log.warning("heartbeat failed: %s", exc)

    def run(self, burst: bool = False) -> None:
        """Serve jobs until SIGTERM/SIGINT (or, with `burst`, until the queue is empty)."""
        serve_model(self.loaded)
        self.heartbeat()
        beating = threading.Thread(target=self._beat_forever, name="icl-heartbeat", daemon=True)
        beating.start()
        worker = SimpleWorker(
            [self.queue],
            connection=self.connection,
            name=self.name,
            serializer=self.queue.serializer,
            exception_handlers=[_no_retry_after_exception],
        )
        log.info("worker %s serves %s on queue %s", self.name, self.loaded.name, self.queue.name)
        try:
            worker.work(burst=burst, with_scheduler=False, logging_level="INFO")
        finally:
            self._stop.set()
            beating.join(timeout=5)
            try:
                remove_beat(self.connection, self.name)
            except RedisError as exc:
                log.warning("could not remove the heartbeat: %s", exc)
