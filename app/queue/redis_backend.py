"""The Backend over Redis: RQ queues (one per model id) to the workers, results cached in Redis.

The web tier never loads a model: it reads the workers' heartbeats to know which models are live
and with which weights, hashes each request into a job id, and serves finished results from
Redis (a hash of parts, model_worker.service.queue.result_parts). Redis calls run with short
timeouts, so an unreachable Redis answers 503 at once. Redis is the queue and the hot cache;
the durable store (app.store) keeps each accepted request and, once seen done, the result: a
result that expired or was lost is read from the store, a job Redis lost is enqueued again
from its stored request.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError
from redis.retry import Retry
from rq import Retry as JobRetry
from rq.exceptions import DeserializationError, InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.job import JobStatus as RqStatus

from app.job_news import News
from app.queue.batch_work import is_batch, price_patch, reused
from app.queue.body_cache import BodyCache
from app.queue.fair import place_ahead
from app.queue.interface import BackendError, PartsReader, client_limit, display_client
from app.queue.job_watch import JobWatch
from app.queue.prompt_limit import PromptLimit
from app.store import (
    FAILED,
    ResultStore,
    Retention,
    StoredJob,
    StoreError,
    open_store,
    pin_caps,
)
from model_worker.checks.arguments import check_towers_positions
from model_worker.checks.budget import BudgetError, check_analysis, check_experiment
from model_worker.checks.patch_pairs import check_heads, check_pair
from model_worker.common.errors import UserInputError, cancelled_message, cancelling_text
from model_worker.common.log_safety import redact
from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.contracts.experiments import ExperimentRequest
from model_worker.contracts.patching import PatchingResult, PatchRequest
from model_worker.service.queue.eta import queued_text, wait_s
from model_worker.service.queue.heartbeats import WorkerBeat, last_beat, live_beats
from model_worker.service.queue.keys import (
    analysis_job_id,
    cancel_key,
    claim_key,
    client_jobs_key,
    experiment_job_id,
    heads_stage_key,
    interactive_queue_name,
    is_experiment,
    job_kind,
    patching_job_id,
    queue_name,
    result_key,
    slice_claims_key,
    slices_key,
)
from model_worker.service.queue.reaper import fetch_job, reap_abandoned, rq_queue
from model_worker.service.queue.redis_values import as_bytes, as_text
from model_worker.service.queue.result_parts import BODY, Parts, result_json, result_parts
from model_worker.service.queue.signing import request_digest, result_signer
from model_worker.service.queue.states import JobState, JobStatus, ModelInfo, done_body

T = TypeVar("T")
ANALYSIS_FUNC = "model_worker.service.jobs.analysis_job"
EXPERIMENT_FUNC = "model_worker.service.jobs.experiment_job"
PATCHING_FUNC = "model_worker.service.jobs.patching_job"
FAILED_TTL_S = 24 * 3600
CLAIM_TTL_S = 10
QUEUED = {RqStatus.QUEUED, RqStatus.DEFERRED, RqStatus.SCHEDULED}
#: A client's list of jobs is forgotten after this long without a new submission.
CLIENT_JOBS_TTL_S = 24 * 3600
#: What reading a malformed RQ job record raises (bad JSON, dates, statuses, field types).
MALFORMED = (ValueError, TypeError, KeyError, AttributeError, DeserializationError)
#: How long a result stays in Redis once the web tier kept it in the store.
ADOPTED_TTL_S = 600
#: Pending jobs of the durable store looked at by one `maintain()` pass.
SWEEP_BATCH = 200
log = logging.getLogger(__name__)


def _byte_keys(parts: dict[Any, Any]) -> Parts:
    """A Redis hash's fields (bytes) as parts (str names)."""
    return {as_text(name): as_bytes(value) for name, value in parts.items()}


def _last_line(text: str | None) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:500] if lines else "the job failed"


class RedisBackend(PartsReader):
    """Jobs through RQ, results and heartbeats in Redis, results and requests kept in the
    durable store; safe to run in several web processes (with a shared PostgreSQL store)."""

    def __init__(self, settings: Settings, store: ResultStore | None = None) -> None:
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
        # the asyncio client needs its own Retry: with the blocking one, a connection Redis
        # closed (a restart) failed the first read on it instead of reconnecting
        async_options = options | {"retry": AsyncRetry(NoBackoff(), 1)}
        self._aredis = AsyncRedis.from_url(self._url, **async_options)
        # finished results on their way from the workers: the cache, else the queue's Redis
        cache = settings.cache_redis_url
        self._results = Redis.from_url(cache, **options) if cache else self._redis
        self._aresults = AsyncRedis.from_url(cache, **async_options) if cache else self._aredis
        self._watch = JobWatch(self._aredis)  # long polls: one mark read per tick
        self._store = store or open_store(settings)
        self._persisted: set[str] = set()  # jobs whose result this process put in the store
        self._failures: set[str] = set()  # jobs whose failure this process put in the store
        self._signer = result_signer(settings)
        self._retention = Retention(self._store, settings)
        self._digests: dict[str, str] = {}  # job -> the digest of its stored request
        self._seen: dict[str, WorkerBeat] = {}  # model -> the last beat of one of its workers
        self._seen_beats: list[WorkerBeat] = []  # the live beats read last

    @property
    def store(self) -> ResultStore:
        """The durable store (requests, results, studies)."""
        return self._store

    def _unreachable(self, exc: Exception) -> BackendError:
        return BackendError(
            redact(f"the job queue (Redis at {self._url}) is unreachable: {exc}; ")
            + "retry in a few seconds",
            status=503,
            retry_after=5,
        )

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking Redis/RQ/store function in a thread; their errors become 503."""
        try:
            return await asyncio.to_thread(fn, *args)
        except RedisError as exc:
            raise self._unreachable(exc) from exc
        except StoreError as exc:
            raise BackendError(str(exc), status=503, retry_after=5) from exc

    # --- submitting -------------------------------------------------------------------------

    async def submit(self, request: AnalysisRequest, client: str = "") -> JobState:
        return await self._call(self._submit, request, client)

    async def submit_experiment(self, request: ExperimentRequest, client: str = "") -> JobState:
        return await self._call(self._submit, request, client)

    async def submit_patch(
        self, request: PatchRequest, client: str = "", reuse: str | None = None
    ) -> JobState:
        base = await self.patching(reuse) if reuse is not None else None
        return await self._call(self._submit, request, client, reuse, base)

    async def known(self, request: AnalysisRequest) -> JobState | None:
        """The state of the analysis `request` if it was accepted already (submits nothing)."""
        return await self._call(self._known, request)

    def _known(self, request: AnalysisRequest) -> JobState | None:
        model = request.model or self.default_model
        try:
            beats = self._live_for(model)
        except BackendError:  # no worker serves it: nothing to find
            return None
        job_id = analysis_job_id(model, min(beat.fingerprint for beat in beats), request)
        return self._status(job_id) if self._store.job(job_id) is not None else None

    def _live_for(self, model: str) -> list[WorkerBeat]:
        """The live workers of `model`, else the last one seen within the grace period (a
        rolling restart, a Redis restart: the job waits for it); 404 when none was."""
        beats = self._beats()
        serving = [beat for beat in beats if beat.model == model]
        if serving:
            return serving
        remembered = self._remembered(model)
        if remembered is not None:
            return [remembered]
        live = sorted({beat.model for beat in beats})
        offer = f"live models: {', '.join(live)}" if live else "no worker is running"
        raise BackendError(f"no live worker serves model {model!r} ({offer})", status=404)

    def _beats(self) -> list[WorkerBeat]:
        """The live workers' beats, remembered per model (for `_remembered`)."""
        beats = self._seen_beats = live_beats(self._redis)
        for beat in beats:
            self._seen[beat.model] = beat
        return beats

    def _remembered(self, model: str) -> WorkerBeat | None:
        """The last beat of a worker of `model` (this process's memory, or the workers' own
        record in Redis) if it is at most `ICL_WORKER_GRACE_S` old."""
        candidates = [self._seen.get(model), last_beat(self._redis, model)]
        known = [beat for beat in candidates if beat is not None]
        if not known:
            return None
        latest = max(known, key=lambda beat: beat.beat_at)
        fresh = time.time() - latest.beat_at <= self._settings.worker_grace_s
        return latest if fresh else None

    def _submit(
        self,
        request: AnalysisRequest | ExperimentRequest | PatchRequest,
        client: str = "",
        reuse: str | None = None,
        base: PatchingResult | None = None,
    ) -> JobState:
        """Queue `request` (`reuse`, `base`: a finished patch the patch `request` adds heads
        to; when it is the same patch on this model, the job is handed it, signed for this
        request, and computes only the added heads' rows)."""
        model = request.model or self.default_model
        beats = self._live_for(model)
        fingerprint = min(beat.fingerprint for beat in beats)
        handed: tuple[Any, ...] = ()
        try:
            if isinstance(request, ExperimentRequest):
                check_experiment(request, self._settings.max_experiment_n)
                job_id = experiment_job_id(model, fingerprint, request)
            elif isinstance(request, PatchRequest):
                found = reused(base, reuse or "", request, model, fingerprint)
                self._check_patch(request, beats, None if found is None else len(found[1]))
                job_id = patching_job_id(model, fingerprint, request)
                if found is not None and reuse is not None:
                    handed = (self._handed(reuse, found[0], request),)
            else:
                n_tokens = self._prompt_limit.check(self._redis, beats, request.prompt)
                if n_tokens is not None:  # else the worker checks the budget and positions
                    check_towers_positions(n_tokens, request)
                    check_analysis(n_tokens, request, self._settings.max_analysis_cost)
                job_id = analysis_job_id(model, fingerprint, request)
        except (BudgetError, UserInputError) as exc:
            raise BackendError(str(exc), status=422) from exc
        return self._enqueue(job_id, request, model, fingerprint, beats, client, handed)

    def _handed(self, base_id: str, base: PatchingResult, request: PatchRequest) -> list[str]:
        """The finished patch a job adding heads to it is handed (as JSON, for RQ): its id, its
        result, and a signature binding them to `request` (the worker checks it: what reaches
        a worker's signature must have been signed)."""
        parts = result_parts(base)
        signature = self._signer.sign(base_id, request_digest(request), parts)
        return [base_id, parts[BODY].decode(), signature.decode()]

    def _check_patch(
        self, request: PatchRequest, beats: list[WorkerBeat], added: int | None = None
    ) -> None:
        """422 (one sentence) for a pair that cannot be patched, a head the model lacks or a
        job over the budget (app.queue.batch_work; `added`: only that many heads added to a
        finished patch are priced), with the workers' published tokenizer and geometry
        (without them the worker checks, and the job fails with the same sentence)."""
        try:
            sizes = [(beat.n_layers, beat.n_heads) for beat in beats]
            known = [(layers, heads) for layers, heads in sizes if layers and heads]
            if known:
                check_heads(request, *min(known))
            encode = self._prompt_limit.encoder(self._redis, beats)
            if encode is not None:
                check_pair(request, encode)
        except UserInputError as exc:
            raise BackendError(str(exc), status=422) from exc
        n_tokens = self._prompt_limit.check(self._redis, beats, request.prompt)
        price_patch(request, beats, n_tokens, self._settings.max_patch_cost, added)

    def _enqueue(
        self,
        job_id: str,
        request: AnalysisRequest | ExperimentRequest | PatchRequest,
        model: str,
        fingerprint: str,
        beats: list[WorkerBeat],
        client: str | None,
        handed: tuple[Any, ...] = (),
    ) -> JobState:
        """Queue `request` as `job_id` unless it is done (in Redis or the store) or in flight;
        `client` None: a stored request enqueued again (no per-client limit); `handed`: the
        job function's arguments after the request and the result TTL."""
        batch, experiment = is_batch(job_id), is_experiment(job_id)
        known = self._stored_status(job_id)
        if known is not None and known.status != JobStatus.FAILED:
            return known
        if known is None and self._store.has_result(job_id):
            return JobState(id=job_id, status=JobStatus.DONE)
        if not self._claim(job_id):
            return self._twin(job_id)
        try:
            # experiments go in chunks on the batch queue; every worker serves the interactive
            # queue (analyses, patches) first
            name = queue_name(model) if experiment else interactive_queue_name(model)
            queue = rq_queue(name, self._redis)
            queued = queue.count
            if queued >= self._settings.queue_cap:
                raise BackendError(
                    f"the queue for model {model!r} is full ({queued} jobs); try again later",
                    status=429,
                    retry_after=self._retry_after(queued, beats),
                )
            ahead = False  # a client with nothing else queued or running goes first
            if client is not None:
                limit = (
                    self._settings.client_experiments
                    if batch
                    else self._settings.client_queued_jobs
                )
                active = self._active(client)
                refusal = client_limit(batch, active[batch], limit)
                if refusal is not None:
                    raise refusal
                ahead = not any(active.values())
            kind = job_kind(job_id)
            self._store.remember(job_id, kind, model, fingerprint, request.model_dump_json())
            if known is not None:  # a failed (or cancelled) earlier attempt: start afresh
                fetch_job(job_id, self._redis).delete()
                self._redis.delete(cancel_key(job_id))
            timeout = (
                self._settings.job_timeout_s
                if kind == "analysis"
                else self._settings.experiment_timeout_s  # patching: ~100 passes a direction
            )
            func = {"experiment": EXPERIMENT_FUNC, "patching": PATCHING_FUNC}
            job = queue.enqueue(
                func.get(kind, ANALYSIS_FUNC),
                request.model_dump_json(),
                self._settings.result_ttl_s,
                *handed,
                job_id=job_id,
                job_timeout=timeout,
                result_ttl=0,
                failure_ttl=FAILED_TTL_S,
                retry=JobRetry(max=1),
                meta={"model": model},
                description=f"{kind} on {model}",
            )
            position = place_ahead(self._redis, queue, job_id) if ahead else job.get_position()
            if client is not None:
                with self._redis.pipeline(transaction=False) as pipe:
                    pipe.zadd(client_jobs_key(client), {job_id: time.time()})
                    pipe.expire(client_jobs_key(client), CLIENT_JOBS_TTL_S)
                    pipe.execute()
        finally:
            self._redis.delete(claim_key(job_id))
        return JobState(id=job_id, status=JobStatus.QUEUED, position_in_queue=position)

    def _active(self, client: str) -> dict[bool, int]:
        """How many of `client`'s jobs are queued or running, by share (True: batch work,
        app.queue.batch_work); forgets the rest."""
        key = client_jobs_key(client)
        ids = [as_text(member) for member in self._redis.zrange(key, 0, -1)]
        if not ids:
            return {True: 0, False: 0}
        with self._redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hget(Job.key_for(job_id), "status")
                pipe.exists(result_key(job_id))
            replies = pipe.execute()
        waiting = {RqStatus.STARTED.value, *(s.value for s in QUEUED)}
        ended = [  # a stored result ends a job before RQ's own bookkeeping does
            job_id
            for job_id, status, done in zip(ids, replies[::2], replies[1::2], strict=True)
            if done or as_text(status) not in waiting
        ]
        if ended:
            self._redis.zrem(key, *ended)
        waiting_ids = [i for i in ids if i not in ended]
        batch = sum(1 for i in waiting_ids if is_batch(i))
        return {True: batch, False: len(waiting_ids) - batch}

    def _claim(self, job_id: str) -> bool:
        """Take the enqueue lock of `job_id`. Its value is a token of ours: when redis-py retries
        a SET whose first reply was lost (a timeout under load), the retry finds the key set and
        answers "not set", yet the claim is ours and the job must still be enqueued."""
        token = uuid.uuid4().hex
        key = claim_key(job_id)
        if self._redis.set(key, token, nx=True, ex=CLAIM_TTL_S):
            return True
        held = self._redis.get(key)
        return held is not None and as_bytes(held) == token.encode()

    def _twin(self, job_id: str) -> JobState:
        """A twin request is enqueuing `job_id` right now: answered at once, never a wait. Its
        state if the job exists; 202 QUEUED once the twin has recorded the request in the
        store (from then on a status read finds the job, or enqueues it again from the store
        should the twin die before enqueuing); else 503 + Retry-After: 1 (the twin may still be
        refused, and a 202 would name a job nobody enqueues)."""
        known = self._stored_status(job_id)
        if known is not None and known.status != JobStatus.FAILED:  # (failed: a retry starts)
            return known
        stored = self._store.job(job_id)
        if stored is not None and stored.state != FAILED:
            return JobState(id=job_id, status=JobStatus.QUEUED)
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
        try:
            return await self._call(self._status, job_id)
        except BackendError as exc:  # Redis away: a finished job is still done
            if exc.status == 503 and await self._call(self._store.has_result, job_id):
                return self._done(job_id)
            raise

    async def done_body(self, job_id: str) -> bytes | None:
        """A done result's response body: the one kept in memory while the store still holds
        the result (another web process may have pruned it), else read and kept."""
        body = self._bodies.get(job_id)
        if body is not None:
            if await self._call(self._store.has_result, job_id):
                return body
            self._bodies.forget([job_id])
        parts = await self._call(self._read_parts, job_id, None)
        if parts is None:
            return None
        body = done_body(job_id, result_json(job_id, parts))
        self._bodies.put(job_id, body, ttl_s=None)
        return body

    async def read_parts(self, job_id: str, names: Sequence[str] | None = None) -> Parts | None:
        return await self._call(self._read_parts, job_id, names)

    async def wait_for_change(self, job_id: str, at_most_s: float) -> None:
        """Return when the job's mark in Redis changes (app.queue.job_watch), at the latest
        after `at_most_s`."""
        await self._watch.wait(job_id, at_most_s)

    def watch(self, job_id: str) -> AbstractAsyncContextManager[News]:
        """The job's news (app.queue.job_watch): a change of its mark in Redis."""
        return self._watch.subscribe(job_id)

    async def read_heads_stage(self, job_id: str) -> bytes | None:
        """The per-head stage the worker published (model_worker.service.jobs.heads_publisher), if
        its signature holds (a forged or stale one is ignored, with a log line)."""
        try:
            stored = await self._aresults.get(heads_stage_key(job_id))
        except RedisError as exc:
            raise self._unreachable(exc) from exc
        if stored is None:
            return None
        return await self._call(self._verified_stage, job_id, as_bytes(stored))

    def _verified_stage(self, job_id: str, stored: bytes) -> bytes | None:
        digest = self._digest(job_id)
        core = None if digest is None else self._signer.verify_stage(job_id, digest, stored)
        if core is None:
            log.warning("ignored the per-head stage of job %s: unsigned or not ours", job_id)
        return core

    def _read_parts(self, job_id: str, names: Sequence[str] | None) -> Parts | None:
        """From the durable store, the source of truth for finished results; a result a worker
        just left in Redis is checked and kept there first (`_adopt`)."""
        parts = self._store.parts(job_id, names)
        if parts is None and self._adopt(job_id):
            parts = self._store.parts(job_id, names)
        return parts

    def _digest(self, job_id: str) -> str | None:
        """The digest of the request the web tier accepted as `job_id` (None: none was)."""
        digest = self._digests.get(job_id)
        if digest is None:
            stored = self._store.job(job_id)
            if stored is None:
                return None
            if len(self._digests) > 10_000:
                self._digests.clear()
            digest = self._digests[job_id] = request_digest(stored.parsed_request())
        return digest

    def _adopt(self, job_id: str) -> bool:
        """Keep in the store the result a worker left in Redis for `job_id`, once its signature
        holds for the request accepted under that id; True when the store has the result.
        Anything else (unsigned, altered, for a job never accepted, in an old format) is
        deleted from Redis with a log line: the job is then computed again."""
        if job_id in self._persisted:
            if self._store.has_result(job_id):
                return True
            self._persisted.discard(job_id)  # pruned (by this web process or another)
        try:
            raw = self._results.hgetall(result_key(job_id))
        except ResponseError:  # not a hash: not written by a worker of this version
            raw = {b"": b""}
        if not raw:
            return False
        digest = self._digest(job_id)
        signed = _byte_keys(raw)
        parts = None if digest is None else self._signer.verify(job_id, digest, signed)
        if parts is None:
            why = "no such accepted job" if digest is None else "unsigned or altered"
            log.warning("discarded the result of job %s found in Redis (%s)", job_id, why)
            self._results.delete(result_key(job_id))
            return False
        if not self._save(job_id, parts):  # its job row is gone (pruned): so is its result
            log.warning("discarded the result of job %s found in Redis (pruned)", job_id)
            self._results.delete(result_key(job_id))
            return False
        self._results.expire(result_key(job_id), min(ADOPTED_TTL_S, self._settings.result_ttl_s))
        return True

    def _finished(self, job_id: str) -> bool:
        """The job's result is in the store (adopted from Redis if a worker just left it)."""
        if self._store.has_result(job_id):  # (not this process's memory: another may prune)
            return True
        return bool(self._results.exists(result_key(job_id))) and self._adopt(job_id)

    def _status(self, job_id: str) -> JobState | None:
        """The job's state, never its result. QUEUED while a submit holds the claim between
        deleting a failed attempt and enqueuing it afresh (neither the result nor the job
        exists then). A result seen done is copied into the durable store, a failure's reason
        recorded there; a job Redis does not know is answered from the store: done, failed, or
        (accepted but lost, e.g. Redis restarted without persistence) enqueued again."""
        state = self._stored_status(job_id)
        if state is None and self._redis.exists(claim_key(job_id)):
            return JobState(id=job_id, status=JobStatus.QUEUED)
        if state is None:
            return self._recover(job_id)
        if state.status == JobStatus.FAILED and state.error and job_id not in self._failures:
            self._store.fail(job_id, state.error)
            if len(self._failures) > 100_000:
                self._failures.clear()
            self._failures.add(job_id)  # not `_persisted`: that set means "has a result"
        if state.status == JobStatus.RUNNING:
            who = self._redis.get(cancel_key(job_id))
            if who is not None:  # asked to stop: it does at its next slice or stage
                return state.model_copy(update={"message": cancelling_text(as_text(who))})
        return state

    def _save(self, job_id: str, parts: Parts) -> bool:
        """Keep `parts` in the store under the job's row; False when the row is gone."""
        if not self._store.save(job_id, parts):
            self._digests.pop(job_id, None)
            return False
        self._remember_persisted(job_id)
        return True

    def _remember_persisted(self, job_id: str) -> None:
        if len(self._persisted) > 100_000:
            self._persisted.clear()
        self._persisted.add(job_id)

    def _recover(self, job_id: str) -> JobState | None:
        """The state of a job Redis does not know, from the durable store."""
        if self._store.has_result(job_id):
            return JobState(id=job_id, status=JobStatus.DONE)
        stored = self._store.job(job_id)
        if stored is None:
            return None
        if stored.state == FAILED:
            return JobState(id=job_id, status=JobStatus.FAILED, error=stored.error)
        return self._requeue(stored)

    def _requeue(self, stored: StoredJob) -> JobState:
        """Enqueue a stored request again under its id, on a worker with the same weights
        (live, or seen within the grace period: the job waits for it)."""
        beats = [beat for beat in self._beats() if beat.model == stored.model]
        remembered = None if beats else self._remembered(stored.model)
        beats = beats or ([remembered] if remembered is not None else [])
        same = [beat for beat in beats if beat.fingerprint == stored.fingerprint]
        if not same:
            why = (
                f"its workers now load other weights (fingerprint {stored.fingerprint}, now "
                f"{min(beat.fingerprint for beat in beats)}); submit it again"
                if beats
                else "no live worker serves that model now; open this page again once one runs"
            )
            return JobState(
                id=stored.id,
                status=JobStatus.FAILED,
                error=f"this job of model {stored.model!r} was lost by the queue and {why}",
            )
        log.warning("job %s was lost by the queue: enqueued again", stored.id)
        request = stored.parsed_request()
        return self._enqueue(stored.id, request, stored.model, stored.fingerprint, same, None)

    async def accepted_request(
        self, job_id: str
    ) -> AnalysisRequest | ExperimentRequest | PatchRequest | None:
        return await self._call(self._store.accepted_request, job_id)

    async def pin(
        self, job_id: str, pinned: bool = True, owner: str = "", admin: bool = True
    ) -> bool:
        caps = pin_caps(self._settings)
        return await self._call(self._store.pin, job_id, pinned, owner, admin, caps)

    async def cancel(self, job_id: str, client: str, admin: bool = False) -> JobState | None:
        return await self._call(self._cancel, job_id, client, admin)

    def _cancel(self, job_id: str, client: str, admin: bool) -> JobState | None:
        """A queued job leaves its queue now; a running one is asked to stop (its worker reads
        `cancel_key` between two slices, and fails the job saying who cancelled it)."""
        state = self._stored_status(job_id)
        if state is None:
            return None
        if state.status in (JobStatus.DONE, JobStatus.FAILED):
            raise BackendError(f"the job is already {state.status.value}", status=409)
        if not admin and self._redis.zscore(client_jobs_key(client), job_id) is None:
            raise BackendError("only who submitted this job, or an admin, may cancel it", 403)
        who = display_client(client)
        self._redis.set(cancel_key(job_id), who, ex=self._settings.experiment_timeout_s)
        job = fetch_job(job_id, self._redis)
        if job.get_status() not in QUEUED:
            return state.model_copy(update={"message": cancelling_text(who)})
        error = cancelled_message(who)
        job.meta["error"] = error
        job.save_meta()
        job.cancel()
        self._redis.delete(slices_key(job_id), slice_claims_key(job_id))
        self._store.fail(job_id, error)
        self._failures.add(job_id)
        return JobState(id=job_id, status=JobStatus.FAILED, error=error)

    async def maintain(self) -> None:
        """One pass over the store's pending jobs: results copied, failures recorded, lost
        jobs enqueued again (so nothing depends on a client polling)."""
        await self._call(self._maintain)

    def _maintain(self) -> None:
        self._forget(self._retention.run())
        # a job's result waits in Redis up to the TTL after the job ends (older: on a poll)
        settings = self._settings
        since = time.time() - settings.experiment_timeout_s - settings.result_ttl_s
        for stored in self._store.pending(SWEEP_BATCH, since):
            try:
                self._status(stored.id)
            except BackendError:  # e.g. a twin enqueuing it right now: next pass
                continue

    def _forget(self, pruned: list[str]) -> None:
        """Pruned from the store: their Redis copies go too (else the next read would adopt
        them again), and this process's memory of them."""
        self._persisted.difference_update(pruned)
        self._bodies.forget(pruned)
        for start in range(0, len(pruned), 500):
            batch = pruned[start : start + 500]
            self._results.delete(*(result_key(job_id) for job_id in batch))
            self._results.delete(*(heads_stage_key(job_id) for job_id in batch))
            for job_id in batch:
                self._digests.pop(job_id, None)

    def _done(self, job_id: str) -> JobState:
        return JobState(id=job_id, status=JobStatus.DONE)

    def _stored_status(self, job_id: str) -> JobState | None:
        if self._finished(job_id):
            return self._done(job_id)
        try:
            return self._job_status(fetch_job(job_id, self._redis))
        except (NoSuchJobError, InvalidJobOperation):
            # the job finished (and RQ dropped it) or changed while we looked: read again
            if self._finished(job_id):
                return self._done(job_id)
            return self._raw_status(job_id)
        except MALFORMED as exc:  # a malformed job record: skipped (the store recovers it)
            log.warning("deleted the malformed Redis record of job %s: %s", job_id, exc)
            self._redis.delete(Job.key_for(job_id))
            return None

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
            return self._done(job_id) if self._finished(job_id) else None
        if status in {s.value for s in QUEUED}:
            return JobState(id=job_id, status=JobStatus.QUEUED)
        try:  # failed, stopped or canceled: its reason lives in the job's meta
            return self._job_status(fetch_job(job_id, self._redis))
        except (NoSuchJobError, InvalidJobOperation):
            return JobState(id=job_id, status=JobStatus.FAILED, error=f"the job {status}")

    def _job_status(self, job: Job) -> JobState | None:
        job_id = job.id
        status: RqStatus | None = job.get_status()
        waiting = False
        if status == RqStatus.STARTED or status in QUEUED:
            status, waiting = self._check_workers(job, status)
        if status == RqStatus.STARTED:
            return JobState(
                id=job_id,
                status=JobStatus.RUNNING,
                progress=job.meta.get("progress"),
                message=job.meta.get("message"),
                eta_s=job.meta.get("eta_s"),
            )
        if status in QUEUED:
            position = job.get_position()
            message = f"waiting for a worker for {job.meta.get('model', '?')}" if waiting else None
            progress = job.meta.get("progress")
            wait = self._wait_s(job, position)
            if message is None and position is not None:
                message = queued_text(position, wait)
            if progress is not None:  # an experiment between two of its chunks
                waiting_text = "" if message is None else f"; {message}"
                message = f"{job.meta.get('message', '')} (paused between chunks{waiting_text})"
                wait = job.meta.get("eta_s")  # the time left at its rate, not the next start
            return JobState(
                id=job_id,
                status=JobStatus.QUEUED,
                position_in_queue=position,
                message=message,
                progress=progress,
                eta_s=wait,
            )
        if status == RqStatus.FINISHED:  # finished, but its result expired or was never written
            return self._done(job_id) if self._finished(job_id) else None
        return JobState(id=job_id, status=JobStatus.FAILED, error=_failure_reason(job))

    def _wait_s(self, job: Job, position: int | None) -> float | None:
        """About how long until a queued job starts: the jobs ahead of it (and, for an
        experiment, the interactive jobs served first) times its workers' mean job time."""
        if position is None:
            return None
        model = str(job.meta.get("model", ""))
        beats = [beat for beat in self._seen_beats if beat.model == model]
        means = [beat.mean_job_s for beat in beats if beat.mean_job_s is not None]
        if not means:
            return None
        ahead = position
        if job.origin == queue_name(model):
            ahead += rq_queue(interactive_queue_name(model), self._redis).count
        return wait_s(ahead, sum(means) / len(means), len(beats))

    def _check_workers(self, job: Job, status: RqStatus | None) -> tuple[RqStatus | None, bool]:
        """Hand back a job whose worker died; a queued job no live worker can take waits for
        one while a worker of its model was seen within `ICL_WORKER_GRACE_S` (the status and
        True), then fails with the reason."""
        beats = self._beats()
        queue = rq_queue(job.origin, self._redis)
        if status == RqStatus.STARTED:
            reap_abandoned(queue, {beat.name for beat in beats}, results=self._results)
            status = job.get_status(refresh=True)
            job.refresh()
        served = {beat.queue for beat in beats} | {interactive_queue_name(b.model) for b in beats}
        if status in QUEUED and job.origin not in served:
            model = str(job.meta.get("model", "?"))
            if self._remembered(model) is not None:
                return status, True
            grace = self._settings.worker_grace_s
            job.meta["error"] = (
                f"no worker for model {model!r} has been live for {grace:g} s "
                "(ICL_WORKER_GRACE_S); submit it again once one runs"
            )
            job.save_meta()
            job.cancel()
            status = RqStatus.CANCELED
        return status, False

    async def models(self) -> list[ModelInfo]:
        beats = await self._call(self._beats)
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
        beats = self._beats()
        queues = {
            beat.model: rq_queue(beat.queue, self._redis).count
            + rq_queue(interactive_queue_name(beat.model), self._redis).count
            for beat in beats
        }
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
        await self._watch.close()
        await self._aredis.aclose()
        self._redis.close()
        if self._results is not self._redis:
            await self._aresults.aclose()
            self._results.close()
        self._store.close()


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
