"""The embedded default: one process, an in-process worker thread, an in-memory result cache.

Same Backend interface as the Redis workers, for a laptop or a talk. The model loads in the
worker thread at start-up; requests submitted meanwhile wait for it. Experiments run in the same
thread (one forward pass at a time), reporting progress into their JobState.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple

from app.backend import BackendError, JobState, JobStatus, ModelInfo, done_body
from app.contracts import AnalysisRequest, AnalysisResult, ExperimentRequest
from app.keys import analysis_job_id, experiment_job_id
from app.settings import Settings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from model_worker.loading import LoadedModel

log = logging.getLogger(__name__)
MAX_JOBS = 2_000
Progress = Callable[[float, str], None]


class _Entry(NamedTuple):
    stored_at: float
    state: JobState
    body: bytes | None  # the JSON of a done state, serialised once


def _load_from_settings(settings: Settings) -> Callable[[], LoadedModel]:
    def load() -> LoadedModel:
        from model_worker.jobs import load_served_model

        return load_served_model(settings)

    return load


class EmbeddedBackend:
    """In-process worker (one thread: forward passes are serialised) and in-memory cache."""

    def __init__(self, settings: Settings, loader: Callable[[], LoadedModel] | None = None) -> None:
        self.default_model = settings.model
        self._ttl = settings.result_ttl_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="icl-worker")
        self._model: Future[LoadedModel] = self._executor.submit(
            loader or _load_from_settings(settings)
        )
        self._jobs: OrderedDict[str, _Entry] = OrderedDict()
        self._pending: list[str] = []
        self._max_tokens = settings.max_prompt_tokens
        self._tokenizer: PreTrainedTokenizerBase | None = None

    async def _loaded(self) -> LoadedModel:
        try:
            return await asyncio.wrap_future(self._model)
        except Exception as exc:
            raise BackendError(f"the model {self.default_model!r} failed to load: {exc}") from exc

    def _store(self, state: JobState) -> None:
        body = None
        if state.status == JobStatus.DONE:
            payload = state.experiment or state.result
            body = done_body(state.id, payload.model_dump_json().encode()) if payload else None
        self._jobs[state.id] = _Entry(time.monotonic(), state, body)
        self._jobs.move_to_end(state.id)
        while len(self._jobs) > MAX_JOBS:
            self._jobs.popitem(last=False)

    async def _model_for(self, requested: str | None) -> tuple[str, LoadedModel]:
        model_name = requested or self.default_model
        if model_name != self.default_model:
            raise BackendError(
                f"no worker serves model {model_name!r}; this server runs {self.default_model!r}",
                status=404,
            )
        return model_name, await self._loaded()

    async def submit(self, request: AnalysisRequest) -> JobState:
        model_name, loaded = await self._model_for(request.model)
        self._check_length(loaded, request.prompt)
        job_id = analysis_job_id(model_name, loaded.fingerprint, request)

        def work(progress: Progress) -> JobState:
            from model_worker.jobs import DETAILS_MESSAGE, run_analysis

            def heads_stage(partial: AnalysisResult) -> None:
                running = JobStatus.RUNNING
                self._store(
                    JobState(id=job_id, status=running, result=partial, message=DETAILS_MESSAGE)
                )

            result = run_analysis(loaded, request, heads_stage)
            return JobState(id=job_id, status=JobStatus.DONE, result=result)

        return await self._enqueue(job_id, work)

    def _check_length(self, loaded: LoadedModel, prompt: str) -> None:
        """422 at once, with both numbers, for a prompt longer than the limit (the worker
        thread has its own tokenizer: fast tokenizers must not be shared across threads)."""
        from model_worker.errors import PromptError
        from model_worker.prompting import check_length, token_limit

        if self._tokenizer is None:
            self._tokenizer = copy.deepcopy(loaded.tokenizer)
        n_tokens = len(self._tokenizer(prompt, add_special_tokens=True)["input_ids"])
        try:
            check_length(n_tokens, token_limit(loaded, self._max_tokens))
        except PromptError as exc:
            raise BackendError(str(exc), status=422) from exc

    async def submit_experiment(self, request: ExperimentRequest) -> JobState:
        model_name, loaded = await self._model_for(request.model)
        job_id = experiment_job_id(model_name, loaded.fingerprint, request)

        def work(progress: Progress) -> JobState:
            from model_worker.experiments.job import run_experiment

            result = run_experiment(loaded, request, progress)
            return JobState(id=job_id, status=JobStatus.DONE, experiment=result)

        return await self._enqueue(job_id, work)

    async def _enqueue(self, job_id: str, work: Callable[[Progress], JobState]) -> JobState:
        known = await self.status(job_id)
        if known is not None and known.status != JobStatus.FAILED:
            return known
        state = JobState(id=job_id, status=JobStatus.QUEUED)
        self._store(state)
        self._pending.append(job_id)
        self._executor.submit(self._run, job_id, work)
        return state.model_copy(update={"position_in_queue": len(self._pending) - 1})

    def _run(self, job_id: str, work: Callable[[Progress], JobState]) -> None:
        from model_worker.jobs import failure_message

        self._pending.remove(job_id)
        self._store(JobState(id=job_id, status=JobStatus.RUNNING))

        def progress(fraction: float, message: str) -> None:
            self._store(
                JobState(id=job_id, status=JobStatus.RUNNING, progress=fraction, message=message)
            )

        try:
            self._store(work(progress))
        except Exception as exc:  # one failing job must not stop the worker
            log.warning("job %s failed: %s", job_id, exc, exc_info=True)
            self._store(JobState(id=job_id, status=JobStatus.FAILED, error=failure_message(exc)))

    def _entry(self, job_id: str) -> _Entry | None:
        entry = self._jobs.get(job_id)
        if entry is None:
            return None
        if time.monotonic() - entry.stored_at > self._ttl and entry.state.status == JobStatus.DONE:
            del self._jobs[job_id]
            return None
        return entry

    async def status(self, job_id: str) -> JobState | None:
        entry = self._entry(job_id)
        if entry is None:
            return None
        state = entry.state
        if state.status == JobStatus.QUEUED and job_id in self._pending:
            return state.model_copy(update={"position_in_queue": self._pending.index(job_id)})
        return state

    async def done_body(self, job_id: str) -> bytes | None:
        entry = self._entry(job_id)
        return None if entry is None else entry.body

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

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
