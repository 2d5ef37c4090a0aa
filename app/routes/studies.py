"""Studies: `POST /api/studies` (experiments × datasets × seeds as one submission,
app.studies), `GET /api/studies/{id}` (one monotone fraction over its jobs, the stage named,
the time left) and, once every job is done, `GET /api/studies/{id}/results.md` (its results
document); the study's page `/s/{id}` (its progress, its jobs, a Cancel button, the document).
`DELETE /api/jobs/{id}` and the Cancel button cancel a study (app.routes.jobs)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request, Response, status
from fastapi.responses import HTMLResponse, PlainTextResponse

from app.deps import ClientDep, StudiesDep
from app.queue.interface import BackendError
from app.studies import Studies
from app.templating import render, url_path
from model_worker.contracts.studies import StudyRequest
from model_worker.service.queue.states import JobStatus, StudyState

router = APIRouter(tags=["studies"])
StudyId = Annotated[
    str, Path(pattern=r"^s-[0-9a-f]{32}$", description="A study id: `s-` and 32 hex digits.")
]


@router.post(
    "/api/studies",
    response_model=StudyState,
    responses={
        202: {"model": StudyState, "description": "Accepted: its jobs queued or running"},
        404: {"description": "No live worker serves the requested model"},
        422: {
            "description": "Invalid request (an unknown experiment or dataset, a seed twice), "
            "or an experiment over the budget (the message names the knob)"
        },
        429: {"description": "This client has its share of batch work queued; see Retry-After"},
        503: {"description": "The job queue or the store is unreachable"},
    },
)
async def submit_study(
    study: StudyRequest, studies: StudiesDep, client: ClientDep, response: Response
) -> StudyState:
    """Run experiments × datasets × seeds (default: the paper's experiments on
    sentiment-number, seed 0) as one study: its experiment jobs are submitted within this
    client's share of batch work as room frees up, and run as any experiment does. 200 when
    it is done already, else 202 (poll `GET /api/studies/{id}`)."""
    state = await studies.submit(study, client)
    if state.status != JobStatus.DONE:
        response.status_code = status.HTTP_202_ACCEPTED
    return state


@router.get(
    "/api/studies/{study_id}",
    response_model=StudyState,
    responses={404: {"description": "No such study"}},
)
async def get_study(study_id: StudyId, studies: StudiesDep) -> StudyState:
    """The study's state: one fraction over all its jobs (never going back), the running
    job's stage, the time left once measured, each job's state; `document` once done."""
    return await _state(studies, study_id)


async def _state(studies: Studies, study_id: str) -> StudyState:
    state = await studies.state(study_id)
    if state is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study {study_id!r} (unknown)")
    return state


@router.get("/s/{study_id}", response_class=HTMLResponse)
async def study_page(request: Request, study_id: StudyId, studies: StudiesDep) -> HTMLResponse:
    """The study's page: its progress and jobs (each linked to its experiment's page), a
    Cancel button while it runs, its results document once done."""
    context = {"study": await _state(studies, study_id)}
    twin = url_path(request, "get_study", study_id=study_id)
    return render(request, "pages/study.html", context, alternate=twin)


@router.get("/s/{study_id}/status", response_class=HTMLResponse)
async def study_status(request: Request, study_id: StudyId, studies: StudiesDep) -> HTMLResponse:
    """HTMX poll target: the study's status partial."""
    context = {"study": await _state(studies, study_id)}
    twin = url_path(request, "get_study", study_id=study_id)
    return render(request, "partials/_study_status.html", context, alternate=twin)


@router.get(
    "/api/studies/{study_id}/results.md",
    response_class=PlainTextResponse,
    responses={
        404: {"description": "No such study"},
        409: {"description": "The study has not finished (or failed)"},
        410: {"description": "A result of the study is no longer kept: submit it again"},
        501: {"description": "This server renders no results documents"},
    },
)
async def study_document(study_id: StudyId, studies: StudiesDep) -> PlainTextResponse:
    """The results document of a finished study (Markdown; 409 while it runs)."""
    try:
        text = await studies.document(study_id)
    except BackendError as exc:
        raise HTTPException(exc.status, str(exc)) from exc
    return PlainTextResponse(text)
