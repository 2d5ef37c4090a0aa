"""The embedded default: one process, an in-process worker thread, an in-memory result cache.

Same Backend interface as the Redis workers, for a laptop or a talk. The model loads in the
worker thread at start-up; requests submitted meanwhile wait for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from app.backend import BackendError, JobState, JobStatus, ModelInfo
from app.contracts import AnalysisRequest
from app.keys import analysis_job_id
from app.settings import Settings

if TYPE_CHECKING:
    from model_worker.loading import LoadedModel

log = logging.getLogger(__name__)
MAX_JOBS = 2_000


def _load_from_settings(settings: Settings) -> Callable[[], LoadedModel]:
    def load() -> LoadedModel:
        from model_worker.loading import load_model

        return load_model(
            settings.model,
            device=settings.device,
            dtype=settings.dtype,
            cache_dir=settings.cache_dir,
        )

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
        self._jobs: OrderedDict[str, tuple[float, JobState]] = OrderedDict()
        self._pending: list[str] = []

    async def _loaded(self) -> LoadedModel:
        try:
            return await asyncio.wrap_future(self._model)
        except Exception as exc:
            raise BackendError(f"the model {self.default_model!r} failed to load: {exc}") from exc

    def _store(self, state: JobState) -> None:
        self._jobs[state.id] = (time.monotonic(), state)
        self._jobs.move_to_end(state.id)
        while len(self._jobs) > MAX_JOBS:
            self._jobs.popitem(last=False)

    async def submit(self, request: AnalysisRequest) -> JobState:
        model_name = request.model or self.default_model
        if model_name != self.default_model:
            raise BackendError(
                f"no worker serves model {model_name!r}; this server runs {self.default_model!r}",
                status=404,
            )
        loaded = await self._loaded()
        job_id = analysis_job_id(model_name, loaded.fingerprint, request)
        known = await self.status(job_id)
        if known is not None and known.status != JobStatus.FAILED:
            return known
        state = JobState(id=job_id, status=JobStatus.QUEUED)
        self._store(state)
        self._pending.append(job_id)
        self._executor.submit(self._run, job_id, loaded, request)
        return state.model_copy(update={"position_in_queue": len(self._pending) - 1})

    def _run(self, job_id: str, loaded: LoadedModel, request: AnalysisRequest) -> None:
        from model_worker.errors import UserInputError
        from model_worker.jobs import run_analysis

        self._pending.remove(job_id)
        self._store(JobState(id=job_id, status=JobStatus.RUNNING))
        try:
            result = run_analysis(loaded, request)
        except UserInputError as exc:
            self._store(JobState(id=job_id, status=JobStatus.FAILED, error=str(exc)))
        except Exception as exc:  # one failing job must not stop the worker
            log.exception("analysis %s failed", job_id)
            message = f"internal error: {type(exc).__name__}: {exc}"
            self._store(JobState(id=job_id, status=JobStatus.FAILED, error=message))
        else:
            self._store(JobState(id=job_id, status=JobStatus.DONE, result=result))

    async def status(self, job_id: str) -> JobState | None:
        entry = self._jobs.get(job_id)
        if entry is None:
            return None
        stored_at, state = entry
        if time.monotonic() - stored_at > self._ttl and state.status == JobStatus.DONE:
            del self._jobs[job_id]
            return None
        if state.status == JobStatus.QUEUED and job_id in self._pending:
            return state.model_copy(update={"position_in_queue": self._pending.index(job_id)})
        return state

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
