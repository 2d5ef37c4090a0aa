"""Cancelling a job: `DELETE /api/jobs/{id}` (JSON) and the Cancel button of the experiment,
study and patch pages (a same-origin form POST, app.security.origin). Who submitted the job
may cancel it, and so may an admin (`ICL_ADMINS`, named users). A queued job leaves the queue
at once; a running one stops within one slice of its work (an analysis: at the end of its
stage); nothing of it is kept as a result, and its page says it was cancelled and by whom. A
study (`s-…`) is cancelled with every job it has queued or running (app.studies)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import RedirectResponse

from app.deps import BackendDep, ClientDep, JobId, SettingsDep, StudiesDep
from app.queue.interface import BackendError
from app.security.clients import is_admin
from app.templating import url_path
from model_worker.common.settings import Settings
from model_worker.service.queue.keys import is_experiment, is_patching, is_study
from model_worker.service.queue.states import JobState

router = APIRouter(tags=["analyses"])


async def _cancel(
    job_id: str, backend: BackendDep, client: str, settings: Settings, studies: StudiesDep
) -> JobState:
    admin = is_admin(client, settings.admins)
    try:
        if is_study(job_id):
            state = await studies.cancel(job_id, client, admin)
        else:
            state = await backend.cancel(job_id, client, admin)
    except BackendError as exc:
        raise HTTPException(exc.status, str(exc)) from exc
    if state is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id} queued or running")
    return state


@router.delete(
    "/api/jobs/{job_id}",
    response_model=JobState,
    responses={
        403: {"description": "Another client's job (and you are not an admin)"},
        404: {"description": "No such job"},
        409: {"description": "The job has already finished or failed"},
    },
)
async def cancel_job(
    job_id: JobId,
    backend: BackendDep,
    client: ClientDep,
    settings: SettingsDep,
    studies: StudiesDep,
) -> JobState:
    """Cancel a queued or running job or study you submitted (an admin: anyone's). Answers
    its state: failed with `cancelled by …` when it left the queue (a study: at once, its
    running jobs stopping within a slice), else running until its next slice."""
    return await _cancel(job_id, backend, client, settings, studies)


@router.post("/jobs/{job_id}/cancel", response_class=RedirectResponse, status_code=303)
async def cancel_job_form(
    request: Request,
    job_id: JobId,
    backend: BackendDep,
    client: ClientDep,
    settings: SettingsDep,
    studies: StudiesDep,
) -> RedirectResponse:
    """The Cancel button: cancel, then back to the job's page (which says so)."""
    await _cancel(job_id, backend, client, settings, studies)
    if is_study(job_id):
        page = url_path(request, "study_page", study_id=job_id)
    elif is_experiment(job_id):
        page = url_path(request, "experiment_job_page", job_id=job_id)
    elif is_patching(job_id):
        page = url_path(request, "patching_page", job_id=job_id)
    else:
        page = url_path(request, "get_analysis", job_id=job_id)
    return RedirectResponse(page, status_code=303)
