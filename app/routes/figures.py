"""Figure downloads: every registered figure (app.views.figures.registry) in each of its formats
and themes. SVG and PNG are drawn off the event loop by the bounded render pool
(app.views.figure_kit.render_pool) and kept once drawn; CSV and JSON are written here.

An unknown figure or format is a 404, an unknown theme a 422 (FastAPI validates the query); a
result too large to draw is a 413; a pool that is full or a drawing past its time a 503.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response, status

from app.deps import BackendDep, JobId, check_head, done_summary
from app.figure_files import ThemeQuery, built, cached_file, figure_response, registered
from app.queue.interface import Backend
from app.views.figure_kit.export import Format
from app.views.figure_kit.themes import Theme
from app.views.figures.analysis import comparable
from model_worker.service.queue.states import JobStatus

router = APIRouter(prefix="/figures", tags=["figures"])


async def kept_file(
    request: Request, theme: Theme, backend: Backend, *job_ids: str
) -> Response | None:
    """The figure file at this URL if it was served before and every job it draws still reads
    done (a pruned result's files go with it, on every web process); else None."""
    for job_id in job_ids:
        state = await backend.status(job_id)
        if state is None or state.status != JobStatus.DONE:
            return None
    return await cached_file(request, theme)


@router.get("/{job_id}/{name}.{fmt}")
async def analysis_figure_file(
    request: Request,
    job_id: JobId,
    name: str,
    fmt: Format,
    backend: BackendDep,
    theme: ThemeQuery = "light",
) -> Response:
    """An analysis figure (heatmap, layers, flow) of analysis `job_id`."""
    if (served := await kept_file(request, theme, backend, job_id)) is not None:
        return served  # (before building anything)
    entry = registered("analysis", name, fmt)
    result = await done_summary(backend, job_id)
    figure = built(entry, result)
    return await figure_response(request, figure, fmt, theme, f"{job_id[:10]}-{name}.{fmt}")


@router.get("/{job_id}/heads/{name}/{figure}.{fmt}")
async def head_figure_file(
    request: Request,
    job_id: JobId,
    name: str,
    figure: str,
    fmt: Format,
    backend: BackendDep,
    theme: ThemeQuery = "light",
) -> Response:
    """A head's figure from analysis `job_id` (which must hold that head's detail)."""
    if (served := await kept_file(request, theme, backend, job_id)) is not None:
        return served  # (before building anything)
    entry = registered("head", figure, fmt)
    result = await done_summary(backend, job_id)
    check_head(result, name)
    detail = await backend.head_detail(job_id, name) if name in result.detail_mrr else None
    if detail is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"analysis {job_id} has no detail for {name}; open its panel to compute it",
        )
    drawn = built(entry, result, detail)
    return await figure_response(request, drawn, fmt, theme, f"{job_id[:10]}-{name}-{figure}.{fmt}")


@router.get("/compare/{a}/{b}/{name}.{fmt}")
async def compare_figure_file(
    request: Request,
    a: JobId,
    b: JobId,
    name: str,
    fmt: Format,
    backend: BackendDep,
    theme: ThemeQuery = "light",
) -> Response:
    """A figure of two analyses compared (the difference heatmap B − A)."""
    if (served := await kept_file(request, theme, backend, a, b)) is not None:
        return served  # (before building anything)
    entry = registered("compare", name, fmt)
    ra, rb = await done_summary(backend, a), await done_summary(backend, b)
    problem = comparable(ra, rb)
    if problem:
        raise HTTPException(status.HTTP_409_CONFLICT, problem)
    figure = built(entry, ra, rb)
    return await figure_response(request, figure, fmt, theme, f"{a[:10]}-{b[:10]}-{name}.{fmt}")
