"""Job functions: what a worker (RQ or embedded) runs for one request.

The RQ entry points (`analysis_job`, `experiment_job`, `patching_job`) run inside `icl-heads
worker`, which loads its model once and hands it over with `serve_model`. They write the result
JSON to Redis themselves (with the result TTL), so the web tier serves it without RQ, and record
a clear message in the job's meta when they fail.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TypeVar

import torch
from redis import Redis
from redis.exceptions import RedisError, ResponseError
from rq import Retry, get_current_job
from rq import Retry as JobRetry
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.timeouts import JobTimeoutException

from model_worker.analysis.kernels import recheck_due, recheck_now
from model_worker.checks.budget import (
    BudgetError,
    check_analysis,
    check_experiment,
    check_patch,
)
from model_worker.checks.patch_reuse import added_heads
from model_worker.common.errors import JobCancelled, UserInputError, cancelled_message
from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest, AnalysisResult
from model_worker.contracts.experiments import ExperimentRequest, ExperimentResult
from model_worker.contracts.patching import PatchingResult, PatchRequest
from model_worker.experiments.progress import no_progress
from model_worker.model.loading import LoadedModel, load_model
from model_worker.resources.unembedding_cache import HeadUnembeddings
from model_worker.run.analyze import analyze
from model_worker.run.factored import unembedding_builder
from model_worker.run.more_heads import detail_more
from model_worker.service.chunks import OPEN, ChunkOver, ChunkSlicer, drop_slices, open_slices
from model_worker.service.queue.eta import Rate, with_left
from model_worker.service.queue.heartbeats import live_beats
from model_worker.service.queue.keys import (
    COMPUTED_KEY,
    cancel_key,
    experiment_of,
    heads_stage_key,
    helper_job_id,
    interactive_queue_name,
    patching_job_id,
    queue_name,
    result_key,
    slices_key,
)
from model_worker.service.queue.reaper import fetch_job, rq_queue
from model_worker.service.queue.redis_values import as_bytes, as_text
from model_worker.service.queue.result_parts import (
    BODY,
    CORE,
    DETAILS_MESSAGE,
    Parts,
    analysis_parts,
    result_parts,
)
from model_worker.service.queue.signing import (
    SIGNATURE_PART,
    ResultSigner,
    request_digest,
    result_signer,
)
from model_worker.service.recent import RECENT

#: Seconds between two progress writes to Redis (the last one is always written).
PROGRESS_EVERY_S = 0.25
#: Longest failure message stored for a job (it may quote the user's input).
MAX_ERROR_CHARS = 1000
#: Longest pause between two attempts at a Redis write while Redis is away.
MAX_BACKOFF_S = 5.0
#: How long a job's failure reason is offered again while Redis refuses writes (out of memory).
REFUSED_RETRY_S = 30.0

#: Most chunks one experiment runs (each hands its worker back: RQ's Retry, counted by RQ).
MAX_CHUNKS = 1_000_000
#: The helper job function, as its RQ job names it.
HELPER_FUNC = "model_worker.service.jobs.experiment_helper_job"
T = TypeVar("T")
log = logging.getLogger(__name__)


class ResultRefused(Exception):
    """Redis answered but refused to store a result (out of memory, read-only): the job fails
    with this reason instead of retrying the write forever."""


def until_redis_answers(write: Callable[[], T], what: str, refused_for_s: float = 0.0) -> T:
    """`write()`, retried with backoff while Redis is unreachable (restarting, network blip).

    A job's result or failure reason is worth waiting for: it reaches Redis once Redis is back,
    even after a restart that lost everything. The job's timeout bounds the wait; a second
    SIGTERM (or Ctrl-C) stops the worker at once. A Redis that answers with an error (OOM
    under `noeviction`, READONLY) is retried only for `refused_for_s`, then its error raised.
    """
    pause, started = 0.25, time.monotonic()
    while True:
        try:
            return write()
        except ResponseError:
            if time.monotonic() - started >= refused_for_s:
                raise
            log.warning("Redis refused to write %s; retrying in %.2g s", what, pause)
        except RedisError as exc:
            log.warning("could not write %s (%s); retrying in %.2g s", what, exc, pause)
        time.sleep(pause)
        pause = min(MAX_BACKOFF_S, pause * 2)


def within_budget(
    loaded: LoadedModel,
    request: AnalysisRequest | ExperimentRequest | PatchRequest,
    settings: Settings,
    added: int | None = None,
) -> None:
    """UserInputError when `request` is over the budget of `settings` (the web tier checks it
    first when it can count tokens; this holds for every path to a worker). `added`: a patch
    that adds that many heads to a finished one, priced for those alone."""
    try:
        if isinstance(request, ExperimentRequest):
            check_experiment(request, settings.max_experiment_n)
        elif isinstance(request, PatchRequest):
            n_tokens = len(loaded.tokenizer(request.prompt, add_special_tokens=True)["input_ids"])
            g, limit = loaded.geometry, settings.max_patch_cost
            check_patch(request, n_tokens, g.n_layers, g.n_heads, limit, added)
        else:
            ids = loaded.tokenizer(request.prompt, add_special_tokens=True)["input_ids"]
            check_analysis(len(ids), request, settings.max_analysis_cost)
    except BudgetError as exc:
        raise UserInputError(str(exc)) from exc


def run_analysis(
    loaded: LoadedModel,
    request: AnalysisRequest,
    on_heads: Callable[[AnalysisResult], None] | None = None,
    *,
    settings: Settings,
) -> AnalysisResult:
    """Analyse `request` on the loaded model, within the prompt limit and budget of `settings`.
    `on_heads` receives the result of the per-head stage (no head details yet, `request` set)
    first. A request for more of an analysis this worker computed lately (the same prompt and
    options, other heads detailed, label keys or decompositions: `RECENT`) computes only those
    details, from one forward pass (then `on_heads` is not called: the whole result is due)."""
    within_budget(loaded, request, settings)
    base = RECENT.get(loaded, request)
    if base is not None:
        result = detail_more(
            loaded,
            base,
            extra_heads=request.extra_heads,
            towers=request.towers,
            towers_position=request.towers_position,
            towers_versus=request.towers_versus,
            label_keys=request.label_keys,
            top_k_tokens=request.top_k_tokens,
        )
        RECENT.put(loaded, request, result)
        return result.model_copy(update={"request": request})

    def heads_stage(partial: AnalysisResult) -> None:
        if on_heads is not None:
            on_heads(partial.model_copy(update={"request": request}))

    result = analyze(
        loaded,
        request.prompt,
        target=request.target,
        labels=request.labels,
        expected=request.expected,
        norm=request.norm,
        top_k_heads=request.top_k_heads,
        top_k_tokens=request.top_k_tokens,
        extra_heads=request.extra_heads,
        towers=request.towers,
        towers_position=request.towers_position,
        towers_versus=request.towers_versus,
        label_keys=request.label_keys,
        max_tokens=settings.max_prompt_tokens,
        rank_by=request.rank_by,
        on_heads=heads_stage,
    )
    RECENT.put(loaded, request, result)
    return result.model_copy(update={"request": request})


#: A word-classification prompt of about 60 tokens, analysed twice when a worker starts.
WARM_UP_PROMPT = " ".join(
    ["love : bar eight : foo hate : bar two : foo happy : bar six : foo"] * 3 + ["one :"]
)


def warm_up(loaded: LoadedModel) -> None:
    """Analyse a built-in prompt twice, so that the first user's analysis runs at full speed
    (the first two of a process take ~35% longer: kernels created for new shapes, allocator
    growth), then measure the kernels' choices again (kernels.recheck_now) rather than in a
    user's analysis. A model that cannot take the prompt only logs why."""
    started = time.monotonic()
    try:
        for _ in range(2):
            analyze(loaded, WARM_UP_PROMPT)
    except Exception as exc:
        log.warning("warm-up analysis skipped: %s", exc)
        return
    rechecked = recheck_now()
    log.info(
        "warmed up in %.1f s (%d kernel choices measured again)",
        time.monotonic() - started,
        rechecked,
    )


def load_served_model(settings: Settings) -> LoadedModel:
    """The model a worker serves (`ICL_MODEL`, `ICL_DEVICE`, `ICL_DTYPE`), keeping up to
    `ICL_HEAD_UNEMBEDDING_MB` of recurring heads' factored unembeddings, warmed up unless
    `ICL_WARM_UP` is off."""
    loaded = load_model(
        settings.model, device=settings.device, dtype=settings.dtype, cache_dir=settings.cache_dir
    )
    loaded.head_unembeddings = HeadUnembeddings(settings.head_unembedding_mb * 2**20)
    if settings.warm_up:
        warm_up(loaded)
    return loaded


def failure_message(exc: BaseException) -> str:
    """One line for the client (at most MAX_ERROR_CHARS: it is stored and shown): the user's
    mistake as is, else what went wrong inside."""
    message = _failure_message(exc)
    return message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 1] + "…"


def _failure_message(exc: BaseException) -> str:
    if isinstance(exc, UserInputError | ResultRefused):
        return str(exc)
    if isinstance(exc, JobTimeoutException):
        return f"timed out: {exc}"
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return (
            f"out of memory: {str(exc).splitlines()[0] if str(exc) else ''} (try a shorter prompt)"
        )
    return f"internal error: {type(exc).__name__}: {exc}"


class WorkerState:
    """The model a worker serves and what it is doing (read by its heartbeat thread)."""

    def __init__(self) -> None:
        self.loaded: LoadedModel | None = None
        self.settings: Settings | None = None
        self.current_job: str | None = None
        #: Where results go (ICL_CACHE_REDIS_URL); None: the queue's Redis.
        self.results: Redis | None = None
        self.jobs_done = 0
        self.mean_job_s: float | None = None
        self._lock = threading.Lock()

    def finished(self, seconds: float) -> None:
        with self._lock:
            self.jobs_done += 1
            previous = self.mean_job_s
            self.mean_job_s = seconds if previous is None else 0.8 * previous + 0.2 * seconds


STATE = WorkerState()


def serve_model(loaded: LoadedModel, settings: Settings, results: Redis | None = None) -> None:
    """Make `loaded` the model the job functions of this process run on, within the limits of
    `settings` (the worker's), storing results in `results` (None: the queue's Redis)."""
    STATE.loaded, STATE.settings, STATE.results = loaded, settings, results


def _served() -> tuple[LoadedModel, Settings]:
    if STATE.loaded is None or STATE.settings is None:
        raise RuntimeError("no model loaded in this worker (serve_model was not called)")
    return STATE.loaded, STATE.settings


@contextmanager
def _job_context(job: Job) -> Iterator[None]:
    """Track the current job; on failure record a clear message in its meta, then re-raise."""
    STATE.current_job = job.id
    started = time.monotonic()
    try:
        yield
    except BaseException as exc:
        _release_gpu_memory(exc)
        job.meta["error"] = failure_message(exc)
        try:
            until_redis_answers(job.save_meta, f"the failure of job {job.id}", REFUSED_RETRY_S)
        except ResponseError as refused:
            log.error("Redis refused the failure of job %s: %s", job.id, refused)
        raise
    finally:
        STATE.current_job = None
        STATE.finished(time.monotonic() - started)


def _release_gpu_memory(exc: BaseException) -> None:
    if isinstance(exc, torch.OutOfMemoryError):
        torch.cuda.empty_cache()


def store_parts(connection: Redis, job_id: str, parts: Parts, ttl_s: int) -> None:
    """Write a result's (signed) parts as one hash, at once (a MULTI transaction), with its
    TTL: the hand-over to the web tier, which checks the signature and keeps the result."""
    key = result_key(job_id)
    with connection.pipeline() as pipe:
        pipe.delete(key, heads_stage_key(job_id))  # the per-head stage served until now
        pipe.hset(key, mapping=parts)  # type: ignore[arg-type]
        pipe.expire(key, ttl_s)
        pipe.incr(COMPUTED_KEY)
        pipe.execute()


def _store(connection: Redis, job_id: str, signed: Parts, ttl_s: int) -> None:
    """Write the signed result (waiting for Redis if it is away: the work is not thrown away);
    ResultRefused when Redis answers but refuses it (out of memory): the job fails with that
    reason, and the worker goes on to the next job."""

    def write() -> None:
        store_parts(connection, job_id, signed, ttl_s)

    try:
        until_redis_answers(write, f"the result of job {job_id}")
    except ResponseError as exc:
        with suppress(RedisError):  # free what this job held
            connection.delete(heads_stage_key(job_id))
        raise ResultRefused(
            f"Redis refused to store the result ({exc}); the result was dropped. Redis is "
            "full: see maxmemory-policy in docs/deployment.md"
        ) from exc


def _computed(connection: Redis, job_id: str, signer: ResultSigner, digest: str) -> bool:
    """A twin enqueued in a race already finished: a result signed for this job and request
    waits in Redis (unknown while Redis is away, or planted: compute)."""
    try:
        raw = connection.hgetall(result_key(job_id))
    except RedisError:
        return False
    signed = {as_text(name): as_bytes(value) for name, value in raw.items()}
    return bool(signed) and signer.verify(job_id, digest, signed) is not None


def _current() -> tuple[Job, Redis]:
    """The job, and the Redis its result goes to (the cache, or the queue's Redis)."""
    job = get_current_job()
    if job is None:
        raise RuntimeError("job functions run inside an RQ worker")
    return job, STATE.results or job.connection


def analysis_job(request_json: str, result_ttl_s: int) -> None:
    """RQ job: analyse one prompt on this worker's model and cache the result; then, while
    no job waits, the worker's `idle_work`. Cancelled (`cancel_key`), it stops at the end of its
    per-head stage or of its details, keeping nothing."""
    job, connection = _current()
    with _job_context(job):
        request = AnalysisRequest.model_validate_json(request_json)
        loaded, settings = _served()
        signer, digest = result_signer(settings), request_digest(request)
        if _computed(connection, job.id, signer, digest):
            return
        publish = heads_publisher(
            connection, job, result_ttl_s, lambda core: signer.sign_stage(job.id, digest, core)
        )

        def heads_stage(partial: AnalysisResult) -> None:
            stop_if_cancelled(job)  # a cancelled analysis stops between its two stages
            publish(partial)

        try:
            result = run_analysis(loaded, request, heads_stage, settings=settings)
            stop_if_cancelled(job)  # ... or after its details: nothing of it is stored
        except JobCancelled:
            with suppress(RedisError):
                connection.delete(heads_stage_key(job.id))
            raise
        parts = signer.signed(job.id, digest, result_parts(result))
        _store(connection, job.id, parts, result_ttl_s)
    queues = (job.origin, queue_name(loaded.name))
    idle_work(loaded, lambda: _jobs_waiting(job.connection, queues))


def _jobs_waiting(connection: Redis, queues: tuple[str, ...]) -> bool:
    """A job waits on one of `queues` (or Redis cannot say: then stop idle work too)."""
    try:
        return any(rq_queue(queue, connection).count > 0 for queue in queues)
    except RedisError:
        return True


def idle_work(loaded: LoadedModel, should_stop: Callable[[], bool]) -> None:
    """Between jobs, while none waits (`should_stop()` false): the kernel rechecks that are
    due soon (`kernels.recheck_due`: ~0.25 s for SmolLM2's unembedding, once, around a
    worker's 40th analysis, instead of inside it), then the U_h of heads detailed once
    (`build_seen_heads`). Never raises: idle work must not fail a job or the worker."""
    if should_stop():
        return
    try:
        rechecked = recheck_due()
    except Exception:
        log.warning("kernel rechecks between jobs failed", exc_info=True)
    else:
        if rechecked:
            log.info("measured %d kernel choices again between jobs", rechecked)
    build_seen_heads(loaded, should_stop)


def build_seen_heads(loaded: LoadedModel, should_stop: Callable[[], bool]) -> int:
    """Idle work between jobs: build the U_h of heads detailed once, so that their second
    analysis already projects through them (`HeadUnembeddings.build_seen`), one head at a time
    until `should_stop()` (a job waits; one U_h of SmolLM2 took 34–48 ms on a 2-core Zen 3). Returns
    how many; never raises (idle work must not fail a job)."""
    started = time.monotonic()
    try:
        build = unembedding_builder(loaded)
        built = [] if build is None else loaded.head_unembeddings.build_seen(build, should_stop)
    except Exception:
        log.warning("building U_h between jobs failed", exc_info=True)
        return 0
    if built:
        log.info(
            "built the U_h of %d heads seen once in %.2f s between jobs",
            len(built),
            time.monotonic() - started,
        )
    return len(built)


def experiment_job(request_json: str, result_ttl_s: int) -> Retry | None:
    """RQ job: one chunk of a dataset experiment (model_worker.service.chunks), publishing its
    progress in the job's meta; queued again (RQ's Retry) until its last chunk stores the
    result. Its helpers (`experiment_helper_job`) share the slices on the model's other
    workers."""
    job, connection = _current()
    with _job_context(job):
        request = ExperimentRequest.model_validate_json(request_json)
        loaded, settings = _served()
        signer, digest = result_signer(settings), request_digest(request)
        if _computed(connection, job.id, signer, digest):
            return None
        within_budget(loaded, request, settings)
        queue_redis = job.connection
        open_slices(queue_redis, job.id, settings.experiment_timeout_s + result_ttl_s)
        ensure_helpers(job, loaded.name, request_json, result_ttl_s, settings)
        slicer = _slicer(job, job.id, loaded.name, digest, settings, driver=True)
        try:
            result = _experiment(loaded, request, progress_reporter(job), slicer, settings)
        except ChunkOver:
            return next_chunk(job)
        except BaseException:
            drop_slices(queue_redis, job.id)  # cancelled or failed: nothing of it is kept
            raise
        parts = signer.signed(job.id, digest, result_parts(result))
        _store(connection, job.id, parts, result_ttl_s)
        drop_slices(queue_redis, job.id)
    return None


def experiment_helper_job(request_json: str, result_ttl_s: int) -> Retry | None:
    """RQ job: one chunk of help with an experiment's slices (model_worker.service.chunks), on
    a worker other than the driver's; queued again while the experiment runs."""
    job, _ = _current()
    with _job_context(job):
        request = ExperimentRequest.model_validate_json(request_json)
        loaded, settings = _served()
        experiment_id = experiment_of(job.id)
        if not job.connection.hexists(slices_key(experiment_id), OPEN):
            return None  # over (or not started: its driver asks again)
        digest = request_digest(request)
        slicer = _slicer(job, experiment_id, loaded.name, digest, settings, driver=False)
        try:
            _experiment(loaded, request, no_progress, slicer, settings)
        except ChunkOver as over:
            return next_chunk(job) if over.again else None
        except JobCancelled:
            return None
    return None


def next_chunk(job: Job) -> Retry:
    """Queue the job again for its next chunk (RQ's Retry), with a retry for a killed worker
    again: each chunk may lose one worker (model_worker.service.queue.reaper)."""
    job.retries_left = 1
    return Retry(max=MAX_CHUNKS)


def _experiment(
    loaded: LoadedModel,
    request: ExperimentRequest,
    progress: Callable[[float, str], None],
    slicer: ChunkSlicer,
    settings: Settings,
) -> ExperimentResult:
    from model_worker.experiments.job import run_experiment

    return run_experiment(
        loaded, request, progress, max_tokens=settings.max_prompt_tokens, slicer=slicer
    )


def _slicer(
    job: Job, experiment_id: str, model: str, digest: str, settings: Settings, *, driver: bool
) -> ChunkSlicer:
    interactive = interactive_queue_name(model)
    connection = job.connection

    def waiting(queue_name: str) -> bool:
        try:
            return bool(connection.llen(rq_queue(queue_name, connection).key))
        except RedisError:
            return False

    def interactive_waiting() -> bool:
        return waiting(interactive)

    def batch_waiting() -> bool:
        return waiting(job.origin)

    return ChunkSlicer(
        connection,
        experiment_id,
        digest,
        result_signer(settings),
        job.worker_name or "",
        interactive_waiting,
        driver,
        batch_waiting,
        chunk_s=settings.experiment_chunk_s,
    )


def ensure_helpers(
    job: Job, model: str, request_json: str, result_ttl_s: int, settings: Settings
) -> int:
    """Queue a helper chunk job for each other live worker of `model` that has none queued or
    running for this experiment; how many were queued."""
    connection = job.connection
    workers = [beat for beat in live_beats(connection) if beat.model == model]
    queue = rq_queue(job.origin, connection)
    queued = 0
    for number in range(1, len(workers)):
        helper_id = helper_job_id(job.id, number)
        try:
            status = fetch_job(helper_id, connection).get_status()
        except NoSuchJobError:
            status = None
        if status in (JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED):
            continue
        if status is not None:
            connection.delete(Job.key_for(helper_id))
        queue.enqueue(
            HELPER_FUNC,
            request_json,
            result_ttl_s,
            job_id=helper_id,
            job_timeout=settings.experiment_timeout_s,
            result_ttl=0,
            failure_ttl=3600,
            retry=JobRetry(max=1),
            description=f"helper {number} of {job.id}",
        )
        queued += 1
    return queued


def run_patch(
    loaded: LoadedModel,
    request: PatchRequest,
    settings: Settings,
    progress: Callable[[float, str], None],
    base: PatchingResult | None = None,
) -> PatchingResult:
    """Patch `request`, priced first: with `base` (a finished patch it adds heads to, checked
    as this model's) only the added heads' rows, else whole (model_worker.patching.extend)."""
    from model_worker.patching.extend import extend
    from model_worker.patching.run import patch

    added = None if base is None else added_heads(base, request)
    if base is not None and added is not None:
        within_budget(loaded, request, settings, len(added))
        extended = extend(loaded, base, request, settings.max_prompt_tokens, progress)
        if extended is not None:
            return extended
    within_budget(loaded, request, settings)
    return patch(loaded, request, settings.max_prompt_tokens, progress)


#: What a patching job that adds heads to a finished patch is handed (JSON, as RQ stores the
#: job): the finished patch's job id, its result JSON, and the web tier's signature of that
#: result for (that id, the new request's digest).
Reuse = list[str]


def reused_base(
    reuse: Reuse | None,
    request: PatchRequest,
    model: str,
    loaded: LoadedModel,
    signer: ResultSigner,
) -> PatchingResult | None:
    """The finished patch a job may reuse: signed for this request, and computed by this
    model (its id is the content hash of its request with this model's fingerprint); else
    None (the job patches whole)."""
    if reuse is None:
        return None
    base_id, body, signature = reuse
    signed = {BODY: body.encode(), SIGNATURE_PART: signature.encode()}
    if signer.verify(base_id, request_digest(request), signed) is None:
        log.warning("patch %s: the reused result is not signed for it; patching whole", base_id)
        return None
    base = PatchingResult.model_validate_json(body)
    if base.request is None or patching_job_id(model, loaded.fingerprint, base.request) != base_id:
        return None
    return base


def patching_job(request_json: str, result_ttl_s: int, reuse: Reuse | None = None) -> None:
    """RQ job: activation patching of one prompt against its corruption (a UserInputError of
    one sentence fails the job: e.g. a corruption that does not move the logit difference).
    With `reuse`, a finished patch this one adds heads to: only their rows are computed."""
    job, connection = _current()
    with _job_context(job):
        request = PatchRequest.model_validate_json(request_json)
        loaded, settings = _served()
        signer, digest = result_signer(settings), request_digest(request)
        if _computed(connection, job.id, signer, digest):
            return
        model = str(job.meta.get("model") or loaded.name)
        base = reused_base(reuse, request, model, loaded, signer)
        report = progress_reporter(job)

        def progress(fraction: float, message: str) -> None:
            stop_if_cancelled(job)  # a cancelled patch stops at its next step
            report(fraction, message)

        result = run_patch(loaded, request, settings, progress, base)
        parts = signer.signed(job.id, digest, result_parts(result))
        _store(connection, job.id, parts, result_ttl_s)


def heads_publisher(
    connection: Redis, job: Job, ttl_s: int, sign: Callable[[bytes], bytes]
) -> Callable[[AnalysisResult], None]:
    """Publish the per-head stage of an analysis (its core part, signed by `sign`, under
    `heads_stage_key`), then say so in the job's meta, so that the page draws the heatmap while
    the head details are computed; the status read stays a read of the job's meta. Best effort."""

    def publish(partial: AnalysisResult) -> None:
        try:
            stage = sign(analysis_parts(partial)[CORE])
            connection.set(heads_stage_key(job.id), stage, ex=ttl_s)
            job.meta["message"] = DETAILS_MESSAGE
            job.save_meta()
        except RedisError as exc:  # the whole result follows anyway
            log.warning("could not publish the heads of job %s: %s", job.id, exc)

    return publish


def stop_if_cancelled(job: Job) -> None:
    """JobCancelled (saying by whom) when the job was cancelled (`cancel_key`)."""
    try:
        who = job.connection.get(cancel_key(job.id))
    except RedisError:
        return
    if who is not None:
        raise JobCancelled(cancelled_message(as_text(who)))


def progress_reporter(job: Job) -> Callable[[float, str], None]:
    """A `progress(fraction, message)` that writes to the job's meta, at most 4 times a second,
    never lower than the job's progress so far (a chunk replays what earlier chunks did: its
    reports count once they pass where those chunks got to)."""
    last = 0.0
    earlier = float(job.meta.get("progress") or 0.0)  # by earlier chunks of the same job
    reached, replaying = earlier, earlier > 0
    rate = Rate(job.meta.get("rate_at"), float(job.meta.get("rate_fraction") or 0.0))

    def progress(fraction: float, message: str) -> None:
        nonlocal last, reached, replaying
        now = time.monotonic()
        if now - last < PROGRESS_EVERY_S and fraction < 1.0:
            return
        if fraction < reached or (replaying and fraction <= earlier):
            return  # a later chunk replaying what earlier ones did: never back, not even
            # to an earlier message at the same fraction
        replaying = False
        last, reached = now, fraction
        rate.seen(fraction)
        left = rate.left_s(fraction)
        job.meta["progress"] = max(0.0, min(1.0, float(fraction)))
        job.meta["message"] = with_left(message, left)
        job.meta["eta_s"] = left
        job.meta["rate_at"], job.meta["rate_fraction"] = rate.at, rate.fraction
        try:
            job.save_meta()
        except RedisError as exc:  # progress is best effort: the next write may pass
            log.warning("could not write the progress of job %s: %s", job.id, exc)

    return progress
