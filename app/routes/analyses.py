"""JSON API for analyses: submit, poll (analyses and experiments alike), list models."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response, status

from app.deps import BackendDep, ClientDep, JobId, job_state
from app.submission import submit_responses, submitted
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.service.queue.states import JobState, JobStatus, ModelInfo

router = APIRouter(prefix="/api", tags=["analyses"])


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


@router.get("/analyses/{job_id}", response_model=JobState)
async def get_analysis(job_id: JobId, backend: BackendDep, request: Request) -> Response | JobState:
    """The state of a job: analysis ids start with `a-`, experiment ids with `e-` (their
    `progress` and `message` change while they run). Finished ones come straight from the cache;
    the id is a content hash, so the id is their ETag (`If-None-Match` answers 304)."""
    body = await backend.done_body(job_id)
    if body is None:
        state = await job_state(backend, job_id)
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
