"""The head atlas page of an `atlas` experiment: one row per head with every score, sorted by
any column (server-side: the header links swap the table with htmx, and work without it), the
scatter matrix of the scores' ranks with Spearman's ρ and its 95% interval, and a head's panel
on a click (a table row or a point of the matrix)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from fastapi.responses import HTMLResponse

from app.deps import BackendDep, ClientDep, ExperimentStateDep, HeadQuery
from app.figure_files import ThemeQuery, built, figure_response, registered
from app.page_cache import finished_page, stray_parameters
from app.queue.interface import Backend
from app.templating import render, url_path
from app.views.atlas_panels import AtlasHeadPanel, AtlasPanel, NotAnAtlas, Order
from app.views.figure_kit.export import Format
from model_worker.contracts.common import parse_head_name
from model_worker.contracts.experiments import ExperimentResult
from model_worker.service.queue.states import JobState, JobStatus

router = APIRouter(tags=["experiments"])
SortQuery = Annotated[
    str | None, Query(max_length=40, pattern=r"^[a-z_]+$", description="The column sorted by.")
]
OrderQuery = Annotated[Order | None, Query(description="asc or desc.")]


async def _atlas(backend: Backend, state: JobState) -> ExperimentResult:
    """The done atlas experiment; 409 while it runs or after it failed, 404 for another
    experiment."""
    result = await backend.experiment(state.id) if state.status == JobStatus.DONE else None
    if result is None:
        raise HTTPException(status.HTTP_409_CONFLICT, "the experiment has not finished")
    return result


def _panel(
    job_id: str,
    result: ExperimentResult,
    sort: str | None,
    order: Order | None,
    with_figure: bool = True,
) -> AtlasPanel:
    try:
        return AtlasPanel.of(job_id, result, sort, order, with_figure)
    except NotAnAtlas as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None


def _context(panel: AtlasPanel, head: str | None) -> dict[str, Any]:
    return {"atlas": panel, "job_id": panel.job_id, "open_head": head}


#: The query parameters the atlas' page reads (besides the view preferences).
PAGE_READS = ("head", "sort", "order")


async def _kept(
    request: Request,
    backend: Backend,
    client: str,
    state: JobState,
    build: Callable[[ExperimentResult], Response],
    reads: tuple[str, ...] = (),
) -> Response:
    """`build(result)` of the done atlas `state`, kept and built off the loop (409 while it
    runs or after it failed)."""
    if state.status != JobStatus.DONE:
        raise HTTPException(status.HTTP_409_CONFLICT, "the experiment has not finished")

    async def prepare() -> Callable[[], Response]:
        result = await _atlas(backend, state)
        return lambda: build(result)

    return await finished_page(request, client, prepare, reads)


@router.get("/e/{job_id}/atlas", response_class=HTMLResponse)
async def atlas_page(
    request: Request,
    state: ExperimentStateDep,
    backend: BackendDep,
    client: ClientDep,
    head: HeadQuery,
    sort: SortQuery = None,
    order: OrderQuery = None,
) -> Response:
    """The head atlas of a done `atlas` experiment."""
    if (moved := stray_parameters(request, PAGE_READS)) is not None:
        return moved
    twin = url_path(request, "experiment_download", job_id=state.id, item="atlas.csv")

    def build(result: ExperimentResult) -> Response:
        panel = _panel(state.id, result, sort, order)
        return render(request, "pages/atlas.html", _context(panel, head), alternate=twin)

    return await _kept(request, backend, client, state, build, PAGE_READS)


@router.get("/e/{job_id}/atlas/table", response_class=HTMLResponse)
async def atlas_table(
    request: Request,
    state: ExperimentStateDep,
    backend: BackendDep,
    client: ClientDep,
    sort: SortQuery = None,
    order: OrderQuery = None,
) -> Response:
    """The atlas's table sorted by `sort` (htmx swap target of the header links)."""

    def build(result: ExperimentResult) -> Response:
        panel = _panel(state.id, result, sort, order, with_figure=False)
        return render(request, "partials/_atlas_table.html", _context(panel, None))

    return await _kept(request, backend, client, state, build, ("sort", "order"))


@router.get("/e/{job_id}/atlas/heads/{name}", response_class=HTMLResponse)
async def atlas_head_panel(
    request: Request, name: str, state: ExperimentStateDep, backend: BackendDep, client: ClientDep
) -> Response:
    """One head's scores and ranks among the heads."""
    try:
        parse_head_name(name)
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None

    def build(result: ExperimentResult) -> Response:
        panel = AtlasHeadPanel.of(state.id, result, name)
        if panel is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no head {name!r} in this atlas")
        return render(request, "partials/_atlas_head.html", {"head": panel, "job_id": state.id})

    return await _kept(request, backend, client, state, build)


@router.get("/e/{job_id}/atlas/figures/{name}.{fmt}")
async def atlas_figure_file(
    request: Request,
    name: str,
    fmt: Format,
    state: ExperimentStateDep,
    backend: BackendDep,
    theme: ThemeQuery = "light",
) -> Response:
    """The atlas's scatter matrix (`matrix`) as SVG, PNG, CSV (the correlations) or JSON."""
    entry = registered("atlas", name, fmt)
    figure = built(entry, await _atlas(backend, state))
    return await figure_response(request, figure, fmt, theme, f"{state.id[:10]}-atlas-{name}.{fmt}")
