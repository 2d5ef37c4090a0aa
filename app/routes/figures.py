"""Figure downloads: every registered figure (app.views.figures.registry) in each of its formats."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Response, status

from app.deps import BackendDep, JobId, check_head, done_summary
from app.views.figure_kit.export import MEDIA_TYPES, Format, export
from app.views.figure_kit.figure import Figure
from app.views.figures.analysis import comparable
from app.views.figures.registry import FigureEntry, FigureKind, UnknownFigure, figure_entry

router = APIRouter(prefix="/figures", tags=["figures"])


def registered(kind: FigureKind, name: str, fmt: Format) -> FigureEntry:
    """The registry's entry of `name`, or 404 naming the known figures (or their formats)."""
    try:
        entry = figure_entry(kind, name)
    except UnknownFigure as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    if fmt not in entry.formats:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"figure {name!r} downloads as {', '.join(entry.formats)}, not {fmt}",
        )
    return entry


def download(entry: FigureEntry, figure: Figure | None, fmt: Format, prefix: str) -> Response:
    """The figure in `fmt`, as an attachment named `{prefix}-{stem}.{fmt}` (404 when the
    result cannot draw it)."""
    if figure is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, entry.missing)
    filename = f"{prefix}-{figure.stem}.{fmt}"
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
    return Response(export(figure, fmt), media_type=MEDIA_TYPES[fmt], headers=headers)


@router.get("/{job_id}/{name}.{fmt}")
async def analysis_figure_file(
    job_id: JobId, name: str, fmt: Format, backend: BackendDep
) -> Response:
    """An analysis figure (heatmap, layers, flow) of analysis `job_id`."""
    entry = registered("analysis", name, fmt)
    result = await done_summary(backend, job_id)
    return download(entry, entry.build(result), fmt, job_id[:10])


@router.get("/{job_id}/heads/{name}/{figure}.{fmt}")
async def head_figure_file(
    job_id: JobId, name: str, figure: str, fmt: Format, backend: BackendDep
) -> Response:
    """A head's figure from analysis `job_id` (which must hold that head's detail)."""
    entry = registered("head", figure, fmt)
    result = await done_summary(backend, job_id)
    check_head(result, name)
    detail = await backend.head_detail(job_id, name) if name in result.detail_mrr else None
    if detail is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"analysis {job_id} has no detail for {name}; open its panel to compute it",
        )
    return download(entry, entry.build(result, detail), fmt, job_id[:10])


@router.get("/compare/{a}/{b}/{name}.{fmt}")
async def compare_figure_file(
    a: JobId, b: JobId, name: str, fmt: Format, backend: BackendDep
) -> Response:
    """A figure of two analyses compared (the difference heatmap B − A)."""
    entry = registered("compare", name, fmt)
    ra, rb = await done_summary(backend, a), await done_summary(backend, b)
    problem = comparable(ra, rb)
    if problem:
        raise HTTPException(status.HTTP_409_CONFLICT, problem)
    return download(entry, entry.build(ra, rb), fmt, f"{a[:10]}-{b[:10]}")
