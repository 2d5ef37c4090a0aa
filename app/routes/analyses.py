"""JSON API for analyses: submit, poll, list models."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Response, status

from app.backend import JobState, JobStatus, ModelInfo
from app.contracts import AnalysisRequest
from app.deps import BackendDep

router = APIRouter(prefix="/api", tags=["analyses"])


@router.post(
    "/analyses",
    response_model=JobState,
    responses={202: {"model": JobState, "description": "Queued or running"}},
)
async def submit_analysis(
    request: AnalysisRequest, backend: BackendDep, response: Response
) -> JobState:
    """200 with the result when cached, else 202 with the job's id and status."""
    state = await backend.submit(request)
    if state.status != JobStatus.DONE:
        response.status_code = status.HTTP_202_ACCEPTED
    return state


@router.get("/analyses/{job_id}", response_model=JobState)
async def get_analysis(job_id: str, backend: BackendDep) -> JobState:
    state = await backend.status(job_id)
    if state is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"no analysis {job_id!r} (unknown or expired)"
        )
    return state


@router.get("/models", response_model=list[ModelInfo])
async def list_models(backend: BackendDep) -> list[ModelInfo]:
    """Models that have a live worker."""
    return await backend.models()
