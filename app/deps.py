"""Route dependencies in one place: the backend, settings and client, and the lookups that
find a job, its finished analysis or a head or raise the HTTP error that fits (Annotated
aliases, so routes name what they need)."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Query, Request, status
from pydantic import AfterValidator

from app.queue.interface import Backend
from app.security.clients import client_of
from app.studies import Studies
from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisCore, AnalysisSummary
from model_worker.contracts.common import parse_head_name
from model_worker.service.queue.keys import JOB_ID_PATTERN, is_experiment
from model_worker.service.queue.states import JobState, JobStatus


async def get_backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


async def get_studies(request: Request) -> Studies:
    studies: Studies = request.app.state.studies
    return studies


async def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_client(request: Request) -> str:
    """Who is asking (its IPv4 address or IPv6 /64, as the rate limits key on): per-client
    shares of the queue and the fair queue's priority."""
    return client_of(request.scope)


BackendDep = Annotated[Backend, Depends(get_backend)]
ClientDep = Annotated[str, Depends(get_client)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
StudiesDep = Annotated[Studies, Depends(get_studies)]

_JOB_ID_DOC = (
    "A job id: `a-` (analysis), `e-` (experiment), `p-` (patching) or `s-` (study) and 32 hex "
    "digits."
)
#: A job id in a path or a query: anything else is refused (422) before it reaches a backend,
#: a template's URL or RQ (which raises on ids with other characters).
JobId = Annotated[str, Path(pattern=JOB_ID_PATTERN, description=_JOB_ID_DOC)]
JobIdQuery = Annotated[str, Query(pattern=JOB_ID_PATTERN, description=_JOB_ID_DOC)]

#: An analysis id inside a pasted permalink (`http://host/a/a-…?head=L3H1`) or on its own.
_ANALYSIS_ID_IN = re.compile(r"(?:^|/)(a-[0-9a-f]{32})(?=$|[/?#&])")


def analysis_id_of(value: str) -> str:
    """The analysis id that `value` is or whose permalink it is; ValueError otherwise."""
    found = _ANALYSIS_ID_IN.findall(value.strip()[:2000])
    if len(set(found)) != 1:
        raise ValueError(
            f"{value.strip()[:80]!r} is not an analysis id (a- and 32 hex digits) or the "
            "permalink of one (…/a/a-…)"
        )
    return str(found[0])


#: An analysis in a query: its id or its permalink (422 with the reason for anything else).
AnalysisRefQuery = Annotated[
    str,
    Query(max_length=2000, description="An analysis id (`a-…`) or its permalink."),
    AfterValidator(analysis_id_of),
]

# --- lookups: the job, its finished analysis, a head; each raises the HTTP error that fits ---


#: A head's name as routes take it (`L{layer}H{head}`).
async def job_state(backend: Backend, job_id: str) -> JobState:
    """The job's state; 404 with a clear message if it is unknown or expired."""
    state = await backend.status(job_id)
    if state is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"no analysis {job_id!r} (unknown or expired)"
        )
    return state


async def heads_stage(backend: Backend, state: JobState) -> AnalysisSummary | None:
    """The per-head stage of a running analysis (no head details yet), once it is done."""
    return await backend.heads_stage(state.id) if state.status == JobStatus.RUNNING else None


async def done_summary(backend: Backend, job_id: str) -> AnalysisSummary:
    """The finished analysis `job_id` without its head details; 404 if unknown, 409 if not
    finished or failed."""
    state = await job_state(backend, job_id)
    if state.status == JobStatus.FAILED:
        raise HTTPException(status.HTTP_409_CONFLICT, f"analysis {job_id} failed: {state.error}")
    found = await backend.summary(job_id) if state.status == JobStatus.DONE else None
    if found is None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"analysis {job_id} is {state.status}")
    return found


async def get_done_analysis(job_id: JobId, backend: BackendDep) -> AnalysisSummary:
    """The path's finished analysis (see `done_summary`)."""
    return await done_summary(backend, job_id)


async def get_experiment_state(job_id: JobId, backend: BackendDep) -> JobState:
    """The path's experiment; 404 if unknown, expired or not an experiment id."""
    state = await backend.status(job_id)
    if state is None or not is_experiment(job_id):
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"no experiment {job_id!r} (unknown or expired)"
        )
    return state


def is_head_of(result: AnalysisCore, name: str) -> bool:
    """Whether `name` names a head of `result`'s model."""
    return result.has_head(name)


def check_head(result: AnalysisCore, name: str) -> str:
    """`name` if the model has that head, else 404 with what exists."""
    if not is_head_of(result, name):
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"no head {name!r}: heads are L0H0 … L{result.n_layers - 1}H{result.n_heads - 1}",
        )
    return name


async def get_head_query(head: str | None = None) -> str | None:
    """A `?head=` value (it goes into an hx-get URL): None, or a head name; else 422."""
    if head is None:
        return None
    try:
        parse_head_name(head)
    except ValueError:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"?head= must name a head such as L0H1, not {head[:40]!r}",
        ) from None
    return head


DoneAnalysisDep = Annotated[AnalysisSummary, Depends(get_done_analysis)]
ExperimentStateDep = Annotated[JobState, Depends(get_experiment_state)]
HeadQuery = Annotated[str | None, Depends(get_head_query)]
