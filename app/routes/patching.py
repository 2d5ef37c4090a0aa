"""Activation patching of one prompt (docs/patching.md): the JSON API (`POST /api/patch`, polled
at `/api/analyses/{id}` like every job), the analysis page's "patch against…" form, and the
patching page: the head heatmap of patching effects beside the direct-effect heatmap,
attribution against exact patching, the layers, the in-context heads' query / key / value
patches, and a head's per-position view; figures and tables as downloads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Depends, Form, HTTPException, Query, Request, Response, status
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import BaseModel, ValidationError

from app.deps import (
    BackendDep,
    ClientDep,
    HeadQuery,
    JobId,
    analysis_id_of,
    done_summary,
)
from app.figure_files import ThemeQuery, built, figure_response, registered
from app.job_wait import long_poll_slot, next_state
from app.page_cache import finished_page, stray_parameters
from app.queue.interface import Backend, BackendError
from app.submission import form_problem, submit_responses, submitted
from app.templating import render, url_path
from app.views.figure_kit.export import Format
from app.views.patching_panels import PatchHeadPanel, PatchingPanel, direction_of
from app.views.recent import Recent
from model_worker.common.export_text import csv_text
from model_worker.contracts.common import parse_head_name
from model_worker.contracts.patching import PatchingResult, PatchRequest
from model_worker.service.queue.keys import is_patching
from model_worker.service.queue.states import JobState, JobStatus

router = APIRouter(tags=["patching"])
#: The pages built lately, by (job, direction): a job's result never changes.
PANELS: Recent[PatchingPanel] = Recent(16)


# --- submitting ---------------------------------------------------------------------------


@router.post(
    "/api/patch",
    response_model=JobState,
    responses=submit_responses(
        "Invalid request: prompts of different token lengths or label layouts, a corruption "
        "that leaves the prompt unchanged, a head outside the model"
    ),
)
async def submit_patch(
    patch: PatchRequest, backend: BackendDep, client: ClientDep, response: Response
) -> Response | JobState:
    """Activation patching of `prompt` against its corruption (`swap-labels`, `query`, or
    `prompt` with `corrupted_prompt`): 200 with the result when cached, else 202 with the job
    id (poll `/api/analyses/{id}`; the result is the state's `patching`)."""
    if not patch.prompt.strip():
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "the prompt is empty")
    return await submitted(await backend.submit_patch(patch, client), backend, response)


class PatchForm(BaseModel):
    """The analysis page's "patch against…" form: the analysis, a built-in corruption or
    another analysis (`against`, its id or permalink) whose prompt is the corrupted one."""

    job_id: str = ""
    corruption: str = "swap-labels"
    against: str = ""


def _error_page(request: Request, message: str, status_code: int, back: str) -> HTMLResponse:
    context = {"message": message, "back": back}
    return render(request, "pages/patch_refused.html", context, status_code)


@router.post("/patch", response_class=HTMLResponse)
async def patch_form(
    request: Request,
    backend: BackendDep,
    client: ClientDep,
    typed: Annotated[PatchForm, Form()],
) -> Response:
    """Queue the patching of an analysis' prompt and go to its page (a page with the reason,
    and a link back, when refused)."""
    try:
        job_id = analysis_id_of(typed.job_id)
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    back = url_path(request, "analysis_page", job_id=job_id)
    clean = await done_summary(backend, job_id)
    fields: dict[str, Any] = {"prompt": clean.prompt, "model": clean.model}
    if clean.request is not None:
        fields |= {"labels": clean.request.labels, "target": clean.request.target}
    try:
        if typed.corruption == "analysis" or typed.against.strip():
            if not typed.against.strip():
                raise ValueError("give the other analysis' id or permalink to patch against it")
            other_id = analysis_id_of(typed.against)
            other = await done_summary(backend, other_id)
            if other.model != clean.model:
                raise ValueError(
                    f"the two analyses ran on different models ({clean.model}, {other.model})"
                )
            fields |= {"corruption": "prompt", "corrupted_prompt": other.prompt}
        else:
            fields["corruption"] = typed.corruption
        patch = PatchRequest.model_validate(fields)
        state = await backend.submit_patch(patch, client)
    except ValidationError as exc:
        return _error_page(request, form_problem(exc), 422, back)
    except ValueError as exc:
        return _error_page(request, str(exc), 422, back)
    except BackendError as exc:
        return _error_page(request, str(exc), exc.status, back)
    target = url_path(request, "patching_page", job_id=state.id)
    return RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)


# --- reading -------------------------------------------------------------------------------


async def get_patching_state(job_id: JobId, backend: BackendDep) -> JobState:
    """The path's patching job; 404 if unknown, expired or not a patching id (`p-`)."""
    state = await backend.status(job_id) if is_patching(job_id) else None
    if state is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"no patching job {job_id!r} (unknown or expired)"
        )
    return state


PatchingStateDep = Annotated[JobState, Depends(get_patching_state)]


async def _done(backend: Backend, state: JobState) -> PatchingResult | None:
    return await backend.patching(state.id) if state.status == JobStatus.DONE else None


async def _done_or_404(backend: Backend, state: JobState) -> PatchingResult:
    """The result of a job read done; 404 if it was pruned since."""
    result = await _done(backend, state)
    if result is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no patching job {state.id!r} (expired)")
    return result


async def _done_or_409(backend: Backend, state: JobState) -> PatchingResult:
    result = await _done(backend, state)
    if result is None:
        raise HTTPException(status.HTTP_409_CONFLICT, "the patching job has not finished")
    return result


def _direction(result: PatchingResult, direction: str | None) -> Any:
    found = direction_of(result, direction)
    if found is None:
        computed = ", ".join(d.direction for d in result.directions)
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"this result has no {direction} run (it has {computed})"
        )
    return found


def _done_context(
    state: JobState, result: PatchingResult, direction: str | None, head: str | None
) -> dict[str, Any]:
    """A finished patch's page context: its direction's panel (made once) and the open head."""
    chosen = _direction(result, direction)
    patching = PANELS.made(
        (state.id, chosen.direction), lambda: PatchingPanel.of(state.id, result, chosen)
    )
    return {
        "job_id": state.id,
        "state": state,
        "done": True,
        "patching": patching,
        "open_head": head,
    }


async def _page(
    request: Request,
    backend: Backend,
    client: str,
    state: JobState,
    template: str,
    direction: str | None,
    head: str | None,
) -> Response:
    """`template` for the patching job: once done, kept and built off the loop (its panel
    too); until then its progress."""
    twin = _twin(request, state.id)
    if state.status != JobStatus.DONE:
        context = {"job_id": state.id, "state": state, "done": False}
        return render(request, template, context, alternate=twin)

    async def prepare() -> Callable[[], Response]:
        result = await _done_or_404(backend, state)
        return lambda: render(
            request, template, _done_context(state, result, direction, head), alternate=twin
        )

    return await finished_page(request, client, prepare, PAGE_READS)


def _twin(request: Request, job_id: str) -> str:
    return url_path(request, "get_analysis", job_id=job_id)


#: The query parameters a patching page reads (besides the view preferences).
PAGE_READS = ("head",)


@router.get("/p/{job_id}", response_class=HTMLResponse)
async def patching_page(
    request: Request,
    state: PatchingStateDep,
    backend: BackendDep,
    client: ClientDep,
    head: HeadQuery,
) -> Response:
    """The patching job's permalink (its first direction): the figures when done, else its
    progress."""
    if (moved := stray_parameters(request, PAGE_READS)) is not None:
        return moved
    return await _page(request, backend, client, state, "pages/patching.html", None, head)


@router.get("/p/{job_id}/status", response_class=HTMLResponse)
async def patching_status(
    request: Request,
    state: PatchingStateDep,
    backend: BackendDep,
    client: ClientDep,
    wait: Annotated[float, Query(ge=0, le=30, description="Long-poll up to this many s.")] = 0,
) -> Response:
    """HTMX poll target: the status partial, or the whole result once done; with `wait`, as
    soon as the job ends or reports progress (a long poll, as the analysis' status: the page
    shows the result when it is there, not at its next poll)."""
    if wait and state.status in (JobStatus.QUEUED, JobStatus.RUNNING):
        async with long_poll_slot(request.app.state.long_polls, client):
            state = await next_state(backend, state.id, wait, gone=request.is_disconnected)
    done = state.status == JobStatus.DONE
    name = "partials/_patching_body.html" if done else "partials/_patching_status.html"
    return await _page(request, backend, client, state, name, None, None)


@router.get("/p/{job_id}/download/{item}")
async def patching_download(item: str, state: PatchingStateDep, backend: BackendDep) -> Response:
    """`result.json`, or a table as `<direction>_<heads|layers|positions|qkv>.csv`."""
    result = await _done_or_409(backend, state)
    attachment = {"Content-Disposition": f'attachment; filename="{state.id[:10]}-{item}"'}
    if item == "result.json":
        return Response(
            result.model_dump_json(indent=1), media_type="application/json", headers=attachment
        )
    tables = result.tables()
    stem, _, suffix = item.rpartition(".")
    if suffix == "csv" and stem in tables:
        return Response(
            csv_text(tables[stem]), media_type="text/csv; charset=utf-8", headers=attachment
        )
    known = ", ".join(["result.json", *(f"{name}.csv" for name in tables)])
    raise HTTPException(status.HTTP_404_NOT_FOUND, f"no download {item!r}; this has: {known}")


DirectionPath = Literal["denoising", "noising"]


@router.get("/p/{job_id}/{direction}", response_class=HTMLResponse)
async def patching_direction_page(
    request: Request,
    direction: DirectionPath,
    state: PatchingStateDep,
    backend: BackendDep,
    client: ClientDep,
    head: HeadQuery,
) -> Response:
    """The patching page of one direction (denoising or noising)."""
    if (moved := stray_parameters(request, PAGE_READS)) is not None:
        return moved
    return await _page(request, backend, client, state, "pages/patching.html", direction, head)


@router.get("/p/{job_id}/{direction}/heads/{name}", response_class=HTMLResponse)
async def patching_head_panel(
    request: Request,
    direction: DirectionPath,
    name: str,
    state: PatchingStateDep,
    backend: BackendDep,
    client: ClientDep,
) -> Response:
    """One head's panel: its attribution, exact and direct effects and, when this result
    patched it per position, its effect per source position (kept, built off the loop)."""
    try:
        parse_head_name(name)
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    if state.status != JobStatus.DONE:
        raise HTTPException(status.HTTP_409_CONFLICT, "the patching job has not finished")

    async def prepare() -> Callable[[], Response]:
        result = await _done_or_409(backend, state)

        def build() -> Response:
            panel = PatchHeadPanel.of(state.id, result, _direction(result, direction), name)
            if panel is None:
                raise HTTPException(status.HTTP_404_NOT_FOUND, f"no head {name!r} in this model")
            return render(request, "partials/_patch_head.html", {"head": panel, "job_id": state.id})

        return build

    return await finished_page(request, client, prepare)


@router.post("/p/{job_id}/heads", response_class=HTMLResponse)
async def patch_head_positions(
    request: Request,
    state: PatchingStateDep,
    backend: BackendDep,
    client: ClientDep,
    head: Annotated[str, Form(max_length=40)],
    direction: Annotated[DirectionPath, Form()] = "denoising",
) -> Response:
    """Patch head `head` per position too: the same request with the head added (a new job,
    cached by content like every job, that reuses this result and computes only the head's
    rows, priced for those), then its page with that head open."""
    result = await _done_or_409(backend, state)
    back = url_path(request, "patching_page", job_id=state.id)
    if result.request is None:
        return _error_page(request, "this result does not carry its request", 409, back)
    # the heads patched per position so far (the default one included) stay, the new one joins
    computed = [p.name for p in result.directions[0].positions] if result.directions else []
    heads = list(dict.fromkeys([*result.request.heads, *computed, head.strip()]))
    try:
        patch = result.request.model_copy(update={"heads": heads})
        patch = PatchRequest.model_validate(patch.model_dump())
        new = await backend.submit_patch(patch, client, reuse=state.id)
    except ValidationError as exc:
        return _error_page(request, form_problem(exc), 422, back)
    except BackendError as exc:
        return _error_page(request, str(exc), exc.status, back)
    target = url_path(
        request,
        "patching_direction_page",
        {"head": head.strip()},
        job_id=new.id,
        direction=direction,
    )
    return RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)


@router.get("/p/{job_id}/{direction}/figures/{name}.{fmt}")
async def patching_figure_file(
    request: Request,
    direction: DirectionPath,
    name: str,
    fmt: Format,
    state: PatchingStateDep,
    backend: BackendDep,
    theme: ThemeQuery = "light",
) -> Response:
    """A figure of one direction (effects, direct, agreement, sites, qkv) as SVG, PNG, CSV or
    JSON (its Vega-Lite specification)."""
    entry = registered("patching", name, fmt)
    result = await _done_or_409(backend, state)
    figure = built(entry, result, _direction(result, direction))
    filename = f"{state.id[:10]}-{direction}-{name}.{fmt}"
    return await figure_response(request, figure, cast(Format, fmt), theme, filename)


@router.get("/p/{job_id}/{direction}/heads/{name}/{figure}.{fmt}")
async def patching_head_figure_file(
    request: Request,
    direction: DirectionPath,
    name: str,
    figure: str,
    fmt: Format,
    state: PatchingStateDep,
    backend: BackendDep,
    theme: ThemeQuery = "light",
) -> Response:
    """A head's per-position figure (`positions`) of one direction."""
    entry = registered("patching-head", figure, fmt)
    result = await _done_or_409(backend, state)
    drawn = built(entry, result, _direction(result, direction), name)
    filename = f"{state.id[:10]}-{direction}-{name}-{figure}.{fmt}"
    return await figure_response(request, drawn, fmt, theme, filename)
