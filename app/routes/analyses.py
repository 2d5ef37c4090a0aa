"""JSON API for analyses: submit, poll (analyses and experiments alike), list models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response, status

from app.backend import Backend, JobState, JobStatus, ModelInfo
from app.contracts import AnalysisRequest
from app.deps import BackendDep, ClientDep, JobId

router = APIRouter(prefix="/api", tags=["analyses"])


def submit_responses(invalid: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI answers of a job submission (analysis or experiment)."""
    return {
        202: {"model": JobState, "description": "Queued or running"},
        404: {"description": "No live worker serves the requested model"},
        422: {"description": invalid + ", or over the budget (the message names the knob)"},
        429: {
            "description": "The model's queue is full, or this client has its share of it "
            "queued; see Retry-After"
        },
        503: {"description": "The job queue (Redis) is unreachable"},
    }


@router.post(
    "/analyses",
    response_model=JobState,
    responses=submit_responses("Invalid request (e.g. an empty prompt)"),
)
async def submit_analysis(
    request: AnalysisRequest, backend: BackendDep, client: ClientDep, response: Response
) -> Response | JobState:
    """200 with the result when cached, else 202 with the job's id and status."""
    if not request.prompt.strip():
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "the prompt is empty")
    return await submitted(await backend.submit(request, client), backend, response)


async def submitted(state: JobState, backend: Backend, response: Response) -> Response | JobState:
    """A submission's answer: 200 with the whole result when done, else 202 with the state."""
    if state.status == JobStatus.DONE:
        body = await backend.done_body(state.id)
        if body is not None:
            return Response(body, media_type="application/json")
    response.status_code = status.HTTP_202_ACCEPTED
    return state


@router.get("/analyses/{job_id}", response_model=JobState)
async def get_analysis(job_id: JobId, backend: BackendDep, request: Request) -> Response | JobState:
    """The state of a job: analysis ids start with `a-`, experiment ids with `e-` (their
    `progress` and `message` change while they run). Finished ones come straight from the cache;
    the id is a content hash, so the id is their ETag (`If-None-Match` answers 304)."""
    body = await backend.done_body(job_id)
    if body is None:
        state = await backend.status(job_id)
        if state is None:
            raise HTTPException(
                status.HTTP_404_NOT_FOUND, f"no analysis {job_id!r} (unknown or expired)"
            )
        if state.status == JobStatus.RUNNING:  # with its per-head stage, once done
            running = await backend.running_body(state)
            return state if running is None else Response(running, media_type="application/json")
        if state.status != JobStatus.DONE:
            return state
        # it finished between the two reads: answer (and so keep) its body like any other
        body = await backend.done_body(job_id)
        if body is None:
            return state
    etag = f'"{job_id}"'
    headers = {"ETag": etag, "Cache-Control": "private, max-age=3600"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


@router.get("/models", response_model=list[ModelInfo])
async def list_models(backend: BackendDep) -> list[ModelInfo]:
    """Models that have a live worker."""
    return await backend.models()
