"""The Backend over Redis: RQ queues (one per model id) to the workers, results cached in Redis.

The web tier never loads a model: it reads the workers' heartbeats to know which models are live
and with which weights, hashes each request into a job id, and serves finished results straight
from Redis. Redis calls run with short timeouts, so an unreachable Redis answers 503 at once.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry
from rq import Retry as JobRetry
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.job import JobStatus as RqStatus

from app.backend import BackendError, JobState, JobStatus, ModelInfo, done_body
from app.contracts import AnalysisRequest, AnalysisResult, ExperimentRequest, ExperimentResult
from app.keys import (
    analysis_job_id,
    claim_key,
    experiment_job_id,
    is_experiment,
    queue_name,
    result_key,
)
from app.queue.body_cache import BodyCache
from app.queue.heartbeats import WorkerBeat, live_beats
from app.queue.prompt_limit import PromptLimit
from app.queue.reaper import fetch_job, reap_abandoned, rq_queue
from app.security.redact import redact
from app.settings import Settings

T = TypeVar("T")
ANALYSIS_FUNC = "model_worker.jobs.analysis_job"
EXPERIMENT_FUNC = "model_worker.jobs.experiment_job"
FAILED_TTL_S = 24 * 3600
CLAIM_TTL_S = 10
#: How long a submit waits for a twin request that holds the claim to finish enqueuing.
TWIN_WAIT_S = 5.0
QUEUED = {RqStatus.QUEUED, RqStatus.DEFERRED, RqStatus.SCHEDULED}


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def _last_line(text: str | None) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:500] if lines else "the job failed"


class RedisBackend:
    """Jobs through RQ, results and heartbeats in Redis; safe to run in several web processes."""

    def __init__(self, settings: Settings) -> None:
        if not settings.redis_url:
            raise ValueError("RedisBackend needs settings.redis_url")
        self.default_model = settings.model
        self._settings = settings
        self._url = settings.redis_url
        self._prompt_limit = PromptLimit()
        self._bodies = BodyCache()
        options: dict[str, Any] = {
            "socket_timeout": settings.redis_timeout_s,
            "socket_connect_timeout": settings.redis_timeout_s,
            "retry": Retry(NoBackoff(), 1),
            "health_check_interval": 30,
        }
        self._redis = Redis.from_url(self._url, **options)
        self._aredis = AsyncRedis.from_url(self._url, **options)

    def _unreachable(self, exc: Exception) -> BackendError:
        return BackendError(
            redact(f"the job queue (Redis at {self._url}) is unreachable: {exc}; ")
            + "retry in a few seconds",
            status=503,
            retry_after=5,
        )

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking Redis/RQ function in a thread; Redis errors become 503."""
        try:
            return await asyncio.to_thread(fn, *args)
        except RedisError as exc:
            raise self._unreachable(exc) from exc

    # --- submitting -------------------------------------------------------------------------

    async def submit(self, request: AnalysisRequest) -> JobState:
        return await self._call(self._submit, request)

    async def submit_experiment(self, request: ExperimentRequest) -> JobState:
        return await self._call(self._submit, request)

    def _live_for(self, model: str) -> list[WorkerBeat]:
        beats = live_beats(self._redis)
        serving = [beat for beat in beats if beat.model == model]
        if not serving:
            live = sorted({beat.model for beat in beats})
            offer = f"live models: {', '.join(live)}" if live else "no worker is running"
            raise BackendError(f"no live worker serves model {model!r} ({offer})", status=404)
        return serving

    def _submit(self, request: AnalysisRequest | ExperimentRequest) -> JobState:
        model = request.model or self.default_model
        beats = self._live_for(model)
        fingerprint = min(beat.fingerprint for beat in beats)
        experiment = isinstance(request, ExperimentRequest)
        if isinstance(request, ExperimentRequest):
            job_id = experiment_job_id(model, fingerprint, request)
        else:
            self._prompt_limit.check(self._redis, beats, request.prompt)
            job_id = analysis_job_id(model, fingerprint, request)
        known = self._stored_status(job_id)
        if known is not None and known.status != JobStatus.FAILED:
            return known
        if not self._claim(job_id):
            return self._twin(job_id)
        try:
            queue = rq_queue(queue_name(model), self._redis)
            queued = queue.count
            if queued >= self._settings.queue_cap:
                raise BackendError(
                    f"the queue for model {model!r} is full ({queued} jobs); try again later",
                    status=429,
                    retry_after=self._retry_after(queued, beats),
                )
            if known is not None:  # a failed earlier attempt: start afresh
                fetch_job(job_id, self._redis).delete()
            timeout = (
                self._settings.experiment_timeout_s if experiment else self._settings.job_timeout_s
            )
            job = queue.enqueue(
                EXPERIMENT_FUNC if experiment else ANALYSIS_FUNC,
                request.model_dump_json(),
                self._settings.result_ttl_s,
                job_id=job_id,
                job_timeout=timeout,
                result_ttl=0,
                failure_ttl=FAILED_TTL_S,
                retry=JobRetry(max=1),
                meta={"model": model},
                description=f"{'experiment' if experiment else 'analysis'} on {model}",
            )
        finally:
            self._redis.delete(claim_key(job_id))
        return JobState(id=job_id, status=JobStatus.QUEUED, position_in_queue=job.get_position())

    def _claim(self, job_id: str) -> bool:
        """Take the enqueue lock of `job_id`. Its value is a token of ours: when redis-py retries
        a SET whose first reply was lost (a timeout under load), the retry finds the key set and
        answers "not set", yet the claim is ours and the job must still be enqueued."""
        token = uuid.uuid4().hex
        key = claim_key(job_id)
        if self._redis.set(key, token, nx=True, ex=CLAIM_TTL_S):
            return True
        held = self._redis.get(key)
        return held is not None and _bytes(held) == token.encode()

    def _twin(self, job_id: str) -> JobState:
        """A twin request is enqueuing `job_id`: its state once it exists (never a 202 for a job
        that may never be enqueued); 503 if the twin does not finish in time."""
        deadline = time.monotonic() + TWIN_WAIT_S
        while time.monotonic() < deadline:
            known = self._stored_status(job_id)
            if known is not None:
                return known
            if not self._redis.exists(claim_key(job_id)):  # the twin gave up (429, error)
                break
            time.sleep(0.05)
        raise BackendError(
            "an identical request is being submitted right now; retry in a second",
            status=503,
            retry_after=1,
        )

    @staticmethod
    def _retry_after(queued: int, beats: list[WorkerBeat]) -> int:
        """Seconds until the queue has room, from the workers' mean job time (5 s if unknown)."""
        means = [beat.mean_job_s for beat in beats if beat.mean_job_s]
        if not means:
            return 5
        return max(1, min(600, math.ceil(queued * (sum(means) / len(means)) / len(beats))))

    # --- reading ------------------------------------------------------------------------------

    async def status(self, job_id: str) -> JobState | None:
        return await self._call(self._status, job_id)

    async def done_body(self, job_id: str) -> bytes | None:
        body = self._bodies.get(job_id)
        if body is not None:
            return body
        try:
            async with self._aredis.pipeline(transaction=False) as pipe:
                pipe.get(result_key(job_id))
                pipe.pttl(result_key(job_id))
                raw, ttl_ms = await pipe.execute()
        except RedisError as exc:
            raise self._unreachable(exc) from exc
        if raw is None:
            return None
        body = done_body(job_id, _bytes(raw))
        self._bodies.put(job_id, body, ttl_s=ttl_ms / 1000 if ttl_ms > 0 else None)
        return body

    def _done(self, job_id: str, raw: bytes | str) -> JobState:
        if is_experiment(job_id):
            experiment = ExperimentResult.model_validate_json(raw)
            return JobState(id=job_id, status=JobStatus.DONE, experiment=experiment)
        result = AnalysisResult.model_validate_json(raw)
        return JobState(id=job_id, status=JobStatus.DONE, result=result)

    def _status(self, job_id: str) -> JobState | None:
        """The stored state; QUEUED while a submit holds the claim between deleting a failed
        attempt and enqueuing it afresh (neither the result nor the job exists then)."""
        state = self._stored_status(job_id)
        if state is None and self._redis.exists(claim_key(job_id)):
            return JobState(id=job_id, status=JobStatus.QUEUED)
        return state

    def _stored_status(self, job_id: str) -> JobState | None:
        raw = self._redis.get(result_key(job_id))
        if raw is not None:
            return self._done(job_id, raw)
        try:
            return self._job_status(fetch_job(job_id, self._redis))
        except (NoSuchJobError, InvalidJobOperation):
            # the job finished (and RQ dropped it) or changed while we looked: read again
            raw = self._redis.get(result_key(job_id))
            return self._done(job_id, raw) if raw is not None else self._raw_status(job_id)

    def _raw_status(self, job_id: str) -> JobState | None:
        """The state straight from the job's hash, for when RQ's Job object could not be read:
        never "unknown" (404) for a job that exists."""
        raw = self._redis.hget(Job.key_for(job_id), "status")
        status = raw.decode() if isinstance(raw, bytes) else raw
        if status is None:
            return None
        if status == RqStatus.STARTED.value:
            return JobState(id=job_id, status=JobStatus.RUNNING)
        if status == RqStatus.FINISHED.value:  # its result is being stored or has expired
            result = self._redis.get(result_key(job_id))
            return None if result is None else self._done(job_id, result)
        if status in {s.value for s in QUEUED}:
            return JobState(id=job_id, status=JobStatus.QUEUED)
        try:  # failed, stopped or canceled: its reason lives in the job's meta
            return self._job_status(fetch_job(job_id, self._redis))
        except (NoSuchJobError, InvalidJobOperation):
            return JobState(id=job_id, status=JobStatus.FAILED, error=f"the job {status}")

    def _job_status(self, job: Job) -> JobState | None:
        job_id = job.id
        status: RqStatus | None = job.get_status()
        if status == RqStatus.STARTED or status in QUEUED:
            status = self._check_workers(job, status)
        if status == RqStatus.STARTED:
            partial = job.meta.get("partial")  # an analysis' per-head stage, once done
            return JobState(
                id=job_id,
                status=JobStatus.RUNNING,
                progress=job.meta.get("progress"),
                message=job.meta.get("message"),
                result=None if partial is None else AnalysisResult.model_validate_json(partial),
            )
        if status in QUEUED:
            position = job.get_position()
            return JobState(id=job_id, status=JobStatus.QUEUED, position_in_queue=position)
        if status == RqStatus.FINISHED:  # finished, but its result expired or was never written
            raw = self._redis.get(result_key(job_id))
            return None if raw is None else self._done(job_id, raw)
        return JobState(id=job_id, status=JobStatus.FAILED, error=_failure_reason(job))

    def _check_workers(self, job: Job, status: RqStatus | None) -> RqStatus | None:
        """Hand back a job whose worker died; fail a queued job no live worker can take."""
        beats = live_beats(self._redis)
        queue = rq_queue(job.origin, self._redis)
        if status == RqStatus.STARTED:
            reap_abandoned(queue, {beat.name for beat in beats})
            status = job.get_status(refresh=True)
            job.refresh()
        if status in QUEUED and not any(beat.queue == job.origin for beat in beats):
            model = job.meta.get("model", "?")
            job.meta["error"] = f"no live worker serves model {model!r} any more"
            job.save_meta()
            job.cancel()
            status = RqStatus.CANCELED
        return status

    async def models(self) -> list[ModelInfo]:
        beats = await self._call(live_beats, self._redis)
        by_model: dict[str, list[WorkerBeat]] = {}
        for beat in beats:
            by_model.setdefault(beat.model, []).append(beat)
        return [
            ModelInfo(
                name=model,
                fingerprint=min(beat.fingerprint for beat in group),
                workers=len(group),
                ready=True,
            )
            for model, group in sorted(by_model.items())
        ]

    async def health(self) -> dict[str, Any]:
        return await self._call(self._health)

    def _health(self) -> dict[str, Any]:
        self._redis.ping()
        beats = live_beats(self._redis)
        queues = {beat.model: rq_queue(beat.queue, self._redis).count for beat in beats}
        warnings = []
        for model in queues:
            prints = {beat.fingerprint for beat in beats if beat.model == model}
            if len(prints) > 1:
                warnings.append(
                    f"workers for {model!r} load different weights ({', '.join(sorted(prints))})"
                )
        return {
            "mode": "redis",
            "redis": "ok",
            "redis_url": redact(self._url),
            "workers": [_beat_summary(beat) for beat in beats],
            "queued": queues,
            "warnings": warnings,
        }

    async def close(self) -> None:
        await self._aredis.aclose()
        self._redis.close()


def _failure_reason(job: Job) -> str:
    """The message the job recorded, else the last line of RQ's traceback."""
    if job.meta.get("error"):
        return str(job.meta["error"])
    if job.get_status() == RqStatus.CANCELED:
        return "the job was cancelled"
    latest = job.latest_result()
    return _last_line(latest.exc_string if latest is not None else None)


def _beat_summary(beat: WorkerBeat) -> dict[str, Any]:
    return beat.model_dump(include={"name", "model", "device", "host", "jobs_done", "current_job"})
