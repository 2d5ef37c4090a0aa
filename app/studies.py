"""Studies: several experiments × datasets × seeds as one submission (`POST /api/studies`),
ending with their results document (issue 40).

A study is a plan of experiment jobs (model_worker.contracts.studies: one per experiment and
dataset, every seed pooled in each), submitted through the backend like any experiment, so
they run as experiments do (in slices between interactive jobs, in chunks over every worker
of the model) and count against the submitting client's share of batch work
(`ICL_CLIENT_EXPERIMENTS`): the study submits its next job whenever the share has room (on
each read of the study and at each upkeep pass), in the plan's order. Its state is its jobs'
states read together: one fraction (each job an equal part), never going back, the current
job's stage named, the time left at the measured rate. Once every job is done, its results
document is rendered from their results (`study_document`, handed over by the library layer:
icl_heads.study). Cancelling a study cancels each of its queued or running jobs and submits
no more. The study itself (request, client, job ids) is kept in the durable store.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from app.queue.interface import Backend, BackendError, display_client
from app.store import DONE, FAILED, PENDING, StoredStudy, StoreError
from model_worker.checks.budget import BudgetError, check_experiment
from model_worker.common.errors import cancelled_message
from model_worker.common.settings import Settings
from model_worker.contracts.experiments import ExperimentResult
from model_worker.contracts.studies import StudyRequest
from model_worker.datasets import BUILTIN_DATASETS
from model_worker.service.queue.eta import Rate, with_left
from model_worker.service.queue.keys import study_id
from model_worker.service.queue.states import JobState, JobStatus, StudyJob, StudyState

#: The results document of a study's results, in its plan's order (icl_heads.study).
StudyDocument = Callable[[Sequence[ExperimentResult]], str]
#: Studies whose progress (reached fraction, rate) this process remembers.
REMEMBERED = 1_000
#: Studies advanced by one upkeep pass.
SWEEP_BATCH = 100
log = logging.getLogger(__name__)
#: A job's own time left at the end of its message (a study's message says the study's).
_JOB_LEFT = re.compile(r" \(about [^()]* left\)")


def document_path(study: str) -> str:
    return f"/api/studies/{study}/results.md"


class Studies:
    """The studies of one backend (its store keeps them)."""

    def __init__(
        self, backend: Backend, settings: Settings, document: StudyDocument | None = None
    ) -> None:
        self._backend = backend
        self._settings = settings
        self._document = document
        self._lock = asyncio.Lock()  # one advance at a time in this process
        self._progress: OrderedDict[str, tuple[Rate, float]] = OrderedDict()
        self._documents: OrderedDict[str, str] = OrderedDict()

    async def _stored(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A store call in a thread; an unreachable store answers 503."""
        try:
            return await asyncio.to_thread(fn, *args)
        except StoreError as exc:
            raise BackendError(str(exc), status=503, retry_after=5) from exc

    # --- submitting and advancing ---------------------------------------------------------

    async def submit(self, request: StudyRequest, client: str) -> StudyState:
        """Accept `request` (or find it accepted): 422 for an unknown dataset or a job over
        the budget, and whatever the backend answers for its first experiment job (404 no
        worker, 429 the client's share of batch work is full, 503): then nothing is kept."""
        unknown = [name for name in request.datasets if name not in BUILTIN_DATASETS]
        if unknown:
            raise BackendError(
                f"unknown dataset {unknown[0]!r}; a study uses built-in datasets: "
                f"{', '.join(BUILTIN_DATASETS)}",
                status=422,
            )
        plans = request.experiment_requests()
        try:
            for plan in plans:
                check_experiment(plan, self._settings.max_experiment_n)
        except BudgetError as exc:
            raise BackendError(f"{exc} (each experiment of the study)", status=422) from exc
        first = await self._backend.submit_experiment(plans[0], client)
        model = request.model or self._backend.default_model
        fingerprint = next(
            (info.fingerprint for info in await self._backend.models() if info.name == model), ""
        )
        study = study_id(model, fingerprint, request)
        known: StoredStudy | None = await self._stored(self._backend.store.study, study)
        if known is None or known.state == FAILED:
            store = self._backend.store
            json = request.model_dump_json()
            await self._stored(
                store.remember_study, study, model, fingerprint, json, client, len(plans)
            )
            await self._stored(store.study_jobs, study, [first.id] + [None] * (len(plans) - 1))
            self._progress.pop(study, None)
        state = await self.state(study)
        assert state is not None
        return state

    async def advance_all(self) -> None:
        """Upkeep: submit what each pending study has room for, end those that ended."""
        for study in await self._stored(self._backend.store.pending_studies, SWEEP_BATCH):
            record = await self._stored(self._backend.store.study, study)
            if record is not None:
                try:
                    await self._advance(record)
                except BackendError as exc:  # the queue or the store away: next pass
                    log.warning("could not advance study %s: %s", study, exc)

    async def _advance(self, record: StoredStudy) -> tuple[StoredStudy, list[JobState | None]]:
        """Submit the study's next jobs while the client's share has room (again, a job the
        backend no longer knows); record the study done when every job is, failed when one
        failed. The record as it now stands, and its jobs' states."""
        async with self._lock:
            store = self._backend.store
            fresh: StoredStudy | None = await self._stored(store.study, record.id)
            if fresh is None or fresh.state != PENDING:
                return fresh or record, await self._states(fresh or record)
            plans = StudyRequest.model_validate_json(fresh.request).experiment_requests()
            states = await self._states(fresh)
            jobs = [
                job if state is not None else None
                for job, state in zip(fresh.jobs, states, strict=True)
            ]
            for index, plan in enumerate(plans):
                if jobs[index] is not None:
                    continue
                try:
                    submitted = await self._backend.submit_experiment(plan, fresh.client)
                except BackendError as exc:
                    if exc.status == 422:  # the plan cannot run: the study fails, saying why
                        error = f"{plan.name} on {plan.dataset}: {exc}"
                        await self._stored(store.end_study, fresh.id, FAILED, error)
                        return fresh._replace(state=FAILED, error=error), states
                    break  # the share is full, or the queue away: at the next read or upkeep
                jobs[index], states[index] = submitted.id, submitted
            if jobs != fresh.jobs:
                await self._stored(store.study_jobs, fresh.id, jobs)
            fresh = fresh._replace(jobs=jobs)
            for plan, found in zip(plans, states, strict=True):
                if found is not None and found.status == JobStatus.FAILED:
                    error = f"{plan.name} on {plan.dataset} failed: {found.error}"
                    await self._stored(store.end_study, fresh.id, FAILED, error)
                    return fresh._replace(state=FAILED, error=error), states
            if all(found is not None and found.status == JobStatus.DONE for found in states):
                await self._stored(store.end_study, fresh.id, DONE)
                return fresh._replace(state=DONE), states
            return fresh, states

    async def _states(self, record: StoredStudy) -> list[JobState | None]:
        """The state of each submitted job of the study (None: not submitted, or unknown)."""
        return [await self._backend.status(job) if job else None for job in record.jobs]

    # --- reading --------------------------------------------------------------------------

    async def state(self, study: str) -> StudyState | None:
        """The study's state (advanced first while pending); None for an unknown study."""
        record: StoredStudy | None = await self._stored(self._backend.store.study, study)
        if record is None:
            return None
        if record.state == PENDING:
            record, states = await self._advance(record)
        else:
            states = await self._states(record)
        return self._state_of(record, states)

    def _state_of(self, record: StoredStudy, states: list[JobState | None]) -> StudyState:
        plans = StudyRequest.model_validate_json(record.request).experiment_requests()
        jobs: list[StudyJob] = []
        for plan, job_id, state in zip(plans, record.jobs, states, strict=True):
            jobs.append(
                StudyJob(
                    experiment=plan.name,
                    dataset=plan.dataset,
                    id=job_id,
                    status=None if state is None else state.status,
                    progress=None if state is None else state.progress,
                    message=None if state is None else state.message,
                    error=None if state is None else state.error,
                )
            )
        parts = [
            0.0 if s is None else 1.0 if s.status == JobStatus.DONE else s.progress or 0.0
            for s in states
        ]
        fraction = 1.0 if record.state == DONE else sum(parts) / len(parts)
        rate, reached = self._progress.pop(record.id, (Rate(), 0.0))
        fraction = max(fraction, reached)  # a job's state read between two of its chunks
        self._progress[record.id] = (rate, fraction)
        while len(self._progress) > REMEMBERED:
            self._progress.popitem(last=False)
        rate.seen(fraction)
        done = sum(1 for s in states if s is not None and s.status == JobStatus.DONE)
        message = f"{done} of {len(plans)} experiments done"
        current = next(
            (
                (plan, s)
                for plan, s in zip(plans, states, strict=True)
                if s is not None and s.status in (JobStatus.RUNNING, JobStatus.QUEUED)
            ),
            None,
        )
        status = JobStatus.QUEUED
        position = None
        if record.state == DONE:
            status, message = JobStatus.DONE, f"{len(plans)} experiments done"
        elif record.state == FAILED:
            status = JobStatus.FAILED
        elif done or any(
            s is not None and (s.progress or s.status == JobStatus.RUNNING) for s in states
        ):
            status = JobStatus.RUNNING  # (a job between two chunks is queued, with progress)
        left = rate.left_s(fraction) if status == JobStatus.RUNNING else None
        if current is not None and record.state == PENDING:
            plan, s = current
            stage = _JOB_LEFT.sub("", s.message or s.status.value)  # the study's time left
            message += f" · {plan.name} on {plan.dataset}: {stage}"
            if status == JobStatus.QUEUED:
                position, left = s.position_in_queue, s.eta_s
        return StudyState(
            id=record.id,
            status=status,
            progress=fraction,
            message=message if status != JobStatus.RUNNING else with_left(message, left),
            eta_s=left,
            position_in_queue=position,
            error=record.error,
            jobs=jobs,
            document=document_path(record.id) if record.state == DONE else None,
        )

    async def document(self, study: str) -> str:
        """The results document of a finished study: 404 unknown, 409 not finished, 410 a
        result no longer kept (submit it again), 501 a server without the renderer."""
        cached = self._documents.get(study)
        if cached is not None:
            return cached
        state = await self.state(study)
        if state is None:
            raise BackendError(f"no study {study!r} (unknown or expired)", status=404)
        if state.status != JobStatus.DONE:
            raise BackendError(f"the study is {state.status.value}: {state.message}", status=409)
        results = [await self._backend.experiment(job.id or "") for job in state.jobs]
        if any(result is None for result in results):
            raise BackendError(
                "a result of this study is no longer kept; submit the study again", status=410
            )
        if self._document is None:
            raise BackendError("this server renders no results documents", status=501)
        text = await asyncio.to_thread(self._document, [r for r in results if r is not None])
        self._documents[study] = text
        while len(self._documents) > 16:
            self._documents.popitem(last=False)
        return text

    # --- cancelling -----------------------------------------------------------------------

    async def cancel(self, study: str, client: str, admin: bool = False) -> JobState | None:
        """Cancel a pending study of `client` (any for an `admin`): its queued jobs leave the
        queue, its running ones stop within a slice, no more are submitted. None for an
        unknown study; 403 for another client's, 409 for one that ended."""
        store = self._backend.store
        record: StoredStudy | None = await self._stored(store.study, study)
        if record is None:
            return None
        if record.state != PENDING:
            raise BackendError(f"the study is already {record.state}", status=409)
        if not admin and record.client != client:
            raise BackendError("only who submitted this study, or an admin, may cancel it", 403)
        error = cancelled_message(display_client(client))
        if not await self._stored(store.end_study, study, FAILED, error):
            raise BackendError("the study has just ended", status=409)
        for job_id in record.jobs:
            if job_id is None:
                continue
            try:
                await self._backend.cancel(job_id, client, admin)
            except BackendError as exc:  # done already, or someone else's twin job
                log.info("study %s: job %s not cancelled: %s", study, job_id, exc)
        return JobState(id=study, status=JobStatus.FAILED, error=error)
