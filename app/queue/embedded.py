"""The embedded default: one process, an in-process worker thread, results in memory.

Same Backend interface as the Redis workers, for a laptop or a talk. The model loads in the
worker thread at start-up; a request submitted meanwhile answers 503 + Retry-After at once
(after LOADING_WAIT_S) with the time the model is expected to need (`loading_eta_s`).
Experiments run in the same thread (one forward pass at a time), reporting progress into
their JobState, in slices (model_worker.experiments.slices): between two slices the thread runs
every waiting interactive job (analysis, patch) first, and stops an experiment cancelled
meanwhile (`cancel`: its owner or an admin). The queue is capped (`ICL_QUEUE_CAP`, and a
share per client); finished results stay in a memory bounded in bytes
(`ICL_RESULT_MEMORY_BYTES`) in front of the durable
store (app.store), which also keeps every accepted request: a job the process lost (a
restart) is computed again when it is polled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.job_news import JobNews, News
from app.pending import PendingJobs
from app.queue.batch_work import is_batch, reused
from app.queue.interface import (
    BackendError,
    InProcessEngine,
    PartsReader,
    client_limit,
    display_client,
)
from app.store import (
    DONE,
    FAILED,
    PENDING,
    ResultStore,
    Retention,
    StoredJob,
    StoreError,
    open_store,
    pin_caps,
)
from model_worker.checks.budget import BudgetError, check_experiment
from model_worker.common.errors import (
    JobCancelled,
    UserInputError,
    cancelled_message,
    cancelling_text,
)
from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest, AnalysisResult
from model_worker.contracts.experiments import ExperimentRequest
from model_worker.contracts.patching import PatchingResult, PatchRequest
from model_worker.service.queue.eta import Rate, queued_text, wait_s, with_left
from model_worker.service.queue.keys import (
    analysis_job_id,
    experiment_job_id,
    is_experiment,
    job_kind,
    patching_job_id,
)
from model_worker.service.queue.result_parts import (
    CORE,
    DETAILS_MESSAGE,
    Parts,
    analysis_parts,
    result_parts,
    size,
)
from model_worker.service.queue.states import JobState, JobStatus, ModelInfo

if TYPE_CHECKING:
    from model_worker.model.loading import LoadedModel

log = logging.getLogger(__name__)
MAX_JOBS = 2_000
#: How long a submission waits for the loading model before answering 503 + Retry-After.
LOADING_WAIT_S = 2.0
#: Load time assumed for a model this data folder never loaded (SmolLM2 on a CPU: ~1 min).
FIRST_LOAD_S = 60.0
#: Where the last load times of each model are remembered (in ICL_DATA_DIR), and how many.
LOAD_TIMES_FILE = "load_seconds.json"
LOADS_KEPT = 5
Progress = Callable[[float, str], None]
Work = Callable[[Progress], Parts]


class PartsMemory:
    """Finished results' parts, least recently used first out, bounded in bytes (an evicted
    result is read again from the durable store)."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes, self._bytes = max_bytes, 0
        self._items: OrderedDict[str, Parts] = OrderedDict()

    @property
    def bytes(self) -> int:
        return self._bytes

    def get(self, job_id: str) -> Parts | None:
        parts = self._items.get(job_id)
        if parts is not None:
            self._items.move_to_end(job_id)
        return parts

    def forget(self, job_ids: list[str]) -> None:
        """Drop the results of `job_ids` (pruned from the store)."""
        for job_id in job_ids:
            dropped = self._items.pop(job_id, None)
            if dropped is not None:
                self._bytes -= size(dropped)

    def put(self, job_id: str, parts: Parts) -> None:
        if job_id in self._items or size(parts) > self._max_bytes:
            return
        self._items[job_id] = parts
        self._bytes += size(parts)
        while self._bytes > self._max_bytes:
            _, dropped = self._items.popitem(last=False)
            self._bytes -= size(dropped)


class EmbeddedBackend(PartsReader):
    """In-process worker (one thread: forward passes are serialised), results in a bounded
    memory in front of the durable store."""

    def __init__(
        self, settings: Settings, engine: InProcessEngine, store: ResultStore | None = None
    ) -> None:
        self.default_model = settings.model
        self._settings = settings
        self._engine = engine
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="icl-worker")
        self._load_started = time.monotonic()
        self._model: Future[LoadedModel] = self._executor.submit(self._timed_load)
        self._store = store or open_store(settings)
        self._retention = Retention(self._store, settings)
        self._jobs: OrderedDict[str, JobState] = OrderedDict()  # queued, running, failed
        self._memory = PartsMemory(settings.result_memory_bytes)
        self._pending = PendingJobs()  # placed in the event loop, taken in the worker thread
        self._works: dict[str, Work] = {}  # what each queued job runs
        self._owners: dict[str, str] = {}  # queued or running job -> the client that asked
        self._heads: dict[str, bytes] = {}  # running analysis -> its per-head stage's core
        self._cancelled: dict[str, str] = {}  # running job -> who cancelled it
        self._submitters: dict[str, set[str]] = {}  # job -> every client that submitted it
        self._news = JobNews()  # wakes the long polls of a job when it changes
        self._mean_job_s: float | None = None  # recent jobs' mean time (a queued job's wait)

    @property
    def store(self) -> ResultStore:
        """The durable store (requests, results, studies)."""
        return self._store

    def _timed_load(self) -> LoadedModel:
        loaded = self._engine.load()
        seconds = time.monotonic() - self._load_started
        _remember_load_time(self._settings.data_dir, self.default_model, seconds)
        return loaded

    def loading_eta_s(self) -> float | None:
        """Seconds the model is expected to go on loading (None once loaded or failed): the
        median of its last loads in this data folder (else FIRST_LOAD_S) less the time spent
        so far."""
        if self._model.done():
            return None
        expected = expected_load_s(self._settings.data_dir, self.default_model)
        return max(1.0, expected - (time.monotonic() - self._load_started))

    async def _ready(self) -> LoadedModel:
        """The loaded model; while it loads, 503 + Retry-After after at most LOADING_WAIT_S
        (a request never waits silently for a model)."""
        if not self._model.done():
            waiting = asyncio.shield(asyncio.wrap_future(self._model))
            with contextlib.suppress(Exception):  # a failed load is reported by _loaded
                await asyncio.wait_for(waiting, LOADING_WAIT_S)
        eta = self.loading_eta_s()
        if eta is not None:
            seconds = max(1, min(600, math.ceil(eta)))
            raise BackendError(
                f"the model {self.default_model!r} is loading (about {seconds} s left); "
                f"retry in {seconds} s",
                status=503,
                retry_after=seconds,
            )
        return await self._loaded()

    async def _loaded(self) -> LoadedModel:
        try:
            return await asyncio.wrap_future(self._model)
        except Exception as exc:
            raise BackendError(f"the model {self.default_model!r} failed to load: {exc}") from exc

    async def _stored(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A durable-store call in a thread; an unreachable store answers 503."""
        try:
            return await asyncio.to_thread(fn, *args)
        except StoreError as exc:
            raise BackendError(str(exc), status=503, retry_after=5) from exc

    def _set(self, state: JobState) -> None:
        self._jobs[state.id] = state
        self._jobs.move_to_end(state.id)
        while len(self._jobs) > MAX_JOBS:
            self._jobs.popitem(last=False)
        self._news.publish(state.id)

    async def wait_for_change(self, job_id: str, at_most_s: float) -> None:
        await self._news.wait(job_id, at_most_s)

    def watch(self, job_id: str) -> contextlib.AbstractAsyncContextManager[News]:
        return self._news.subscribe(job_id)

    async def _model_for(self, requested: str | None) -> tuple[str, LoadedModel]:
        model_name = requested or self.default_model
        if model_name != self.default_model:
            raise BackendError(
                f"no worker serves model {model_name!r}; this server runs {self.default_model!r}",
                status=404,
            )
        return model_name, await self._ready()

    async def submit(self, request: AnalysisRequest, client: str = "") -> JobState:
        model_name, loaded = await self._model_for(request.model)
        self._check_cost(loaded, request)
        job_id = analysis_job_id(model_name, loaded.fingerprint, request)
        return await self._enqueue(job_id, request, loaded, client)

    async def known(self, request: AnalysisRequest) -> JobState | None:
        """The state of the analysis `request` if it was accepted already (submits nothing)."""
        if (request.model or self.default_model) != self.default_model or not self._model.done():
            return None
        loaded = await self._ready()
        return await self.status(analysis_job_id(loaded.name, loaded.fingerprint, request))

    def _check_cost(self, loaded: LoadedModel, request: AnalysisRequest) -> None:
        """422 at once, with the numbers, for a prompt longer than the limit, a head the model
        does not have or a request over the budget."""
        try:
            self._engine.check_analysis(loaded, request)
        except (UserInputError, BudgetError) as exc:
            raise BackendError(str(exc), status=422) from exc

    async def submit_experiment(self, request: ExperimentRequest, client: str = "") -> JobState:
        try:
            check_experiment(request, self._settings.max_experiment_n)
        except BudgetError as exc:
            raise BackendError(str(exc), status=422) from exc
        model_name, loaded = await self._model_for(request.model)
        job_id = experiment_job_id(model_name, loaded.fingerprint, request)
        return await self._enqueue(job_id, request, loaded, client)

    async def submit_patch(
        self, request: PatchRequest, client: str = "", reuse: str | None = None
    ) -> JobState:
        model_name, loaded = await self._model_for(request.model)
        base = await self.patching(reuse) if reuse is not None else None
        found = reused(base, reuse or "", request, model_name, loaded.fingerprint)
        try:
            self._engine.check_patch(loaded, request, None if found is None else len(found[1]))
        except (UserInputError, BudgetError) as exc:
            raise BackendError(str(exc), status=422) from exc
        job_id = patching_job_id(model_name, loaded.fingerprint, request)
        reusing = None if found is None else found[0]
        return await self._enqueue(job_id, request, loaded, client, reusing)

    def _work(
        self,
        job_id: str,
        loaded: LoadedModel,
        request: AnalysisRequest | ExperimentRequest | PatchRequest,
        base: PatchingResult | None = None,
    ) -> Work:
        """What the worker thread runs for `request`: the result's parts (an analysis keeps its
        per-head stage's core part meanwhile, for the page to draw the heatmap first; a patch
        adding heads to `base` computes only theirs)."""

        def work(progress: Progress) -> Parts:
            if isinstance(request, ExperimentRequest):

                def between_slices() -> None:
                    self._between_slices(job_id)

                experiment = self._engine.experiment(loaded, request, progress, between_slices)
                return result_parts(experiment)
            if isinstance(request, PatchRequest):

                def patch_progress(fraction: float, message: str) -> None:
                    self._stop_if_cancelled(job_id)
                    progress(fraction, message)

                return result_parts(self._engine.patch(loaded, request, patch_progress, base))

            def heads_stage(partial: AnalysisResult) -> None:
                self._stop_if_cancelled(job_id)  # a cancelled analysis stops between stages
                self._heads[job_id] = analysis_parts(partial)[CORE]
                self._set(JobState(id=job_id, status=JobStatus.RUNNING, message=DETAILS_MESSAGE))

            analysis = self._engine.analyze(loaded, request, heads_stage)
            self._stop_if_cancelled(job_id)  # ... and after its details: nothing kept
            return result_parts(analysis)

        return work

    def _check_room(self, job_id: str, client: str) -> None:
        """429 when the queue is full, or when `client` has its share of it already."""
        queued = len(self._pending)
        if queued >= self._settings.queue_cap:
            raise BackendError(
                f"the queue is full ({queued} jobs, ICL_QUEUE_CAP); try again later",
                status=429,
                retry_after=5,
            )
        batch = is_batch(job_id)
        active = sum(
            1
            for other, owner in list(self._owners.items())  # copied: the worker thread pops
            if owner == client and is_batch(other) == batch
        )
        limit = self._settings.client_experiments if batch else self._settings.client_queued_jobs
        refusal = client_limit(batch, active, limit)
        if refusal is not None:
            raise refusal

    async def _enqueue(
        self,
        job_id: str,
        request: AnalysisRequest | ExperimentRequest | PatchRequest,
        loaded: LoadedModel,
        client: str | None,
        base: PatchingResult | None = None,
    ) -> JobState:
        """Queue `request` as `job_id` unless it is done or in flight; `client` None: a
        recomputation of a stored request (no per-client limit); `base`: a finished patch the
        patch `request` adds heads to."""
        known = await self.status(job_id, recover=False)
        if known is not None and known.status != JobStatus.FAILED:
            return known
        if client is not None:
            self._check_room(job_id, client)
            kind = job_kind(job_id)
            await self._stored(
                self._store.remember,
                job_id,
                kind,
                loaded.name,
                loaded.fingerprint,
                request.model_dump_json(),
            )
        ahead = client is not None and client not in list(self._owners.values())
        if client is not None:
            self._owners[job_id] = client
            self._submitters.setdefault(job_id, set()).add(client)
        state = JobState(id=job_id, status=JobStatus.QUEUED)
        self._set(state)
        position = self._pending.place(job_id, ahead)
        self._works[job_id] = self._work(job_id, loaded, request, base)
        self._executor.submit(self._run_next)
        return state.model_copy(update={"position_in_queue": position})

    def _run_next(self) -> None:
        """Run the job at the head of the queue (one call per enqueued job); then, while no
        other waits, the engine's idle work."""
        try:
            job_id = self._pending.pop_next()
        except IndexError:  # run between two slices of an experiment, or cancelled
            return
        self._run(job_id, self._works.pop(job_id))
        if self._model.done() and self._model.exception() is None:
            self._engine.idle_work(self._model.result(), lambda: len(self._pending) > 0)

    def _run(self, job_id: str, work: Work) -> None:
        self._set(JobState(id=job_id, status=JobStatus.RUNNING))
        started, rate, reached = time.monotonic(), Rate(), 0.0

        def progress(fraction: float, message: str) -> None:
            """One fraction, never going back, with the time left at the measured rate."""
            nonlocal reached
            if fraction < reached:
                return
            reached = fraction
            rate.seen(fraction)
            left = rate.left_s(fraction)
            self._set(
                JobState(
                    id=job_id,
                    status=JobStatus.RUNNING,
                    progress=fraction,
                    message=with_left(message, left),
                    eta_s=left,
                )
            )

        try:
            parts = work(progress)
            self._memory.put(job_id, parts)
            self._news.publish(job_id)  # done: read from the memory while the store saves it
            self._store.save(job_id, parts)
            self._jobs.pop(job_id, None)  # done: read from the memory or the store from now on
        except Exception as exc:  # one failing job must not stop the worker
            if not isinstance(exc, JobCancelled):
                log.warning("job %s failed: %s", job_id, exc, exc_info=True)
            error = self._engine.failure_message(exc)
            self._set(JobState(id=job_id, status=JobStatus.FAILED, error=error))
            try:
                self._store.fail(job_id, error)
            except StoreError as store_exc:
                log.error("could not record the failure of %s: %s", job_id, store_exc)
        finally:
            seconds = time.monotonic() - started
            previous = self._mean_job_s
            self._mean_job_s = seconds if previous is None else 0.8 * previous + 0.2 * seconds
            self._owners.pop(job_id, None)
            self._heads.pop(job_id, None)
            self._cancelled.pop(job_id, None)
            self._submitters.pop(job_id, None)

    def _between_slices(self, experiment_id: str) -> None:
        """Between two slices of a running experiment: stop it if cancelled, else run every
        interactive job that waits (analyses and patches never wait behind a whole experiment)."""
        self._stop_if_cancelled(experiment_id)
        while (job_id := self._pending.take_first(lambda job: not is_experiment(job))) is not None:
            self._run(job_id, self._works.pop(job_id))
        self._stop_if_cancelled(experiment_id)

    def _stop_if_cancelled(self, job_id: str) -> None:
        who = self._cancelled.get(job_id)
        if who is not None:
            raise JobCancelled(cancelled_message(who))

    async def cancel(self, job_id: str, client: str, admin: bool = False) -> JobState | None:
        """Cancel a queued or running job of `client` (any job for an `admin`): a queued one
        at once, a running one at its next slice (an analysis: at the end of its stage, per-head
        or details); None for a job this server does not run.
        403 for another client's job, 409 for a finished one."""
        state = await self.status(job_id, recover=False)
        if state is None:
            return None
        if state.status in (JobStatus.DONE, JobStatus.FAILED):
            raise BackendError(f"the job is already {state.status.value}", status=409)
        if not admin and client not in self._submitters.get(job_id, set()):
            raise BackendError("only who submitted this job, or an admin, may cancel it", 403)
        who = display_client(client)
        if self._pending.remove(job_id):
            self._works.pop(job_id, None)
            self._owners.pop(job_id, None)
            self._submitters.pop(job_id, None)
            error = cancelled_message(who)
            self._set(JobState(id=job_id, status=JobStatus.FAILED, error=error))
            await self._stored(self._store.fail, job_id, error)
            return self._jobs[job_id]
        self._cancelled[job_id] = who
        return state.model_copy(update={"message": cancelling_text(who)})

    async def status(self, job_id: str, recover: bool = True) -> JobState | None:
        if self._memory.get(job_id) is not None:  # done, also while the store saves it
            return JobState(id=job_id, status=JobStatus.DONE)
        state = self._jobs.get(job_id)
        if state is not None:
            position = self._pending.position(job_id) if state.status == JobStatus.QUEUED else None
            if position is not None:
                wait = wait_s(position, self._mean_job_s)
                update = {"position_in_queue": position, "eta_s": wait}
                return state.model_copy(update=update | {"message": queued_text(position, wait)})
            who = self._cancelled.get(job_id)
            if who is not None and state.status == JobStatus.RUNNING:
                return state.model_copy(update={"message": cancelling_text(who)})
            return state
        stored = await self._stored(self._store.job, job_id)
        if stored is None:
            has_result = await self._stored(self._store.has_result, job_id)
            return JobState(id=job_id, status=JobStatus.DONE) if has_result else None
        if stored.state == DONE:
            return JobState(id=job_id, status=JobStatus.DONE)
        if stored.state == FAILED:
            return JobState(id=job_id, status=JobStatus.FAILED, error=stored.error)
        if stored.state == PENDING and recover:  # accepted by an earlier process: run it again
            return await self._recompute(stored)
        return None

    async def _recompute(self, stored: StoredJob) -> JobState:
        """Queue a stored request again under its id (its result was lost or never made)."""
        loaded = await self._loaded()
        if stored.fingerprint != loaded.fingerprint:
            return JobState(
                id=stored.id,
                status=JobStatus.FAILED,
                error=f"this job was accepted for other weights of {self.default_model!r} "
                f"(fingerprint {stored.fingerprint}, now {loaded.fingerprint}); submit it again",
            )
        log.info("recomputing %s from its stored request", stored.id)
        return await self._enqueue(stored.id, stored.parsed_request(), loaded, None)

    async def read_parts(self, job_id: str, names: Sequence[str] | None = None) -> Parts | None:
        parts = self._memory.get(job_id)
        if parts is None:
            parts = await self._stored(self._store.parts, job_id, names)
            if parts is not None and names is None:
                self._memory.put(job_id, parts)
            return parts
        return parts if names is None else {name: parts[name] for name in names if name in parts}

    async def read_heads_stage(self, job_id: str) -> bytes | None:
        return self._heads.get(job_id)

    async def models(self) -> list[ModelInfo]:
        ready = self._model.done() and self._model.exception() is None
        fingerprint = self._model.result().fingerprint if ready else ""
        return [ModelInfo(name=self.default_model, fingerprint=fingerprint, workers=1, ready=ready)]

    async def health(self) -> dict[str, Any]:
        if self._model.done() and self._model.exception() is not None:
            model_state = f"failed: {self._model.exception()}"
        else:
            model_state = "ready" if self._model.done() else "loading"
        return {
            "mode": "embedded",
            "redis": None,
            "model": self.default_model,
            "model_state": model_state,
            "queued": len(self._pending),
        }

    async def accepted_request(
        self, job_id: str
    ) -> AnalysisRequest | ExperimentRequest | PatchRequest | None:
        return await self._stored(self._store.accepted_request, job_id)

    async def pin(
        self, job_id: str, pinned: bool = True, owner: str = "", admin: bool = True
    ) -> bool:
        caps = pin_caps(self._settings)
        return bool(await self._stored(self._store.pin, job_id, pinned, owner, admin, caps))

    async def maintain(self) -> None:
        """The store's retention (the worker thread stores each result itself); a pruned
        result leaves the memory too."""
        self._memory.forget(await self._stored(self._retention.run))

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._store.close()


def _load_times(folder: Path) -> dict[str, list[float]]:
    """The remembered load times of each model, oldest first (empty when none or unreadable;
    a file from before kept one number a model: that one)."""
    try:
        times = json.loads((folder / LOAD_TIMES_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(times, dict):
        return {}
    found: dict[str, list[float]] = {}
    for model, value in times.items():
        values = value if isinstance(value, list) else [value]
        kept = [float(v) for v in values if isinstance(v, int | float) and v > 0]
        if kept:
            found[str(model)] = kept[-LOADS_KEPT:]
    return found


def expected_load_s(folder: Path, model: str) -> float:
    """How long `model` is expected to load: the median of its last LOADS_KEPT loads in this
    data folder (one slow first load, converting the weights, or one fast warm one does not
    set the next estimate), else FIRST_LOAD_S."""
    times = _load_times(folder).get(model)
    return statistics.median(times) if times else FIRST_LOAD_S


def _remember_load_time(folder: Path, model: str, seconds: float) -> None:
    times = _load_times(folder)
    times[model] = [*times.get(model, []), round(seconds, 1)][-LOADS_KEPT:]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / LOAD_TIMES_FILE).write_text(json.dumps(times))
    except OSError as exc:
        log.warning("could not remember the load time of %s: %s", model, exc)
