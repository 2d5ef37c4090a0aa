"""Figure downloads: every figure as SVG, PNG, CSV or JSON."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, HTTPException, Response, status

from app.deps import BackendDep, JobId
from app.figures.analysis import (
    comparable,
    diff_figure,
    head_figure,
    heatmap_figure,
    layers_figure,
)
from app.figures.base import Figure
from app.figures.export import to_csv, to_json, to_png
from app.routes.panels import check_head, done_summary

router = APIRouter(prefix="/figures", tags=["figures"])
Format = Literal["svg", "png", "csv", "json"]
MEDIA = {
    "svg": "image/svg+xml",
    "png": "image/png",
    "csv": "text/csv; charset=utf-8",
    "json": "application/json",
}


def download(figure: Figure, fmt: Format, prefix: str) -> Response:
    """The figure in `fmt`, as an attachment named `{prefix}-{stem}.{fmt}`."""
    body: str | bytes
    if fmt == "svg":
        body = '<?xml version="1.0" encoding="UTF-8"?>\n' + figure.svg
    elif fmt == "png":
        body = to_png(figure)
    elif fmt == "csv":
        body = to_csv(figure)
    else:
        body = to_json(figure)
    filename = f"{prefix}-{figure.stem}.{fmt}"
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
    return Response(body, media_type=MEDIA[fmt], headers=headers)


@router.get("/{job_id}/{figure}.{fmt}")
async def analysis_figure(
    job_id: JobId, figure: Literal["heatmap", "layers"], fmt: Format, backend: BackendDep
) -> Response:
    result = await done_summary(backend, job_id)
    built = heatmap_figure(result) if figure == "heatmap" else layers_figure(result)
    return download(built, fmt, job_id[:10])


@router.get("/{job_id}/heads/{name}/{figure}.{fmt}")
async def head_figure_file(
    job_id: JobId,
    name: str,
    figure: Literal["attention", "increase", "margin"],
    fmt: Format,
    backend: BackendDep,
) -> Response:
    """A head's figure from analysis `job_id` (which must hold that head's detail)."""
    result = await done_summary(backend, job_id)
    check_head(result, name)
    detail = await backend.head_detail(job_id, name) if name in result.detail_mrr else None
    if detail is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"analysis {job_id} has no detail for {name}; open its panel to compute it",
        )
    built = head_figure(result, detail, figure)
    if built is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, "no label margin: the prompt lacks two labels"
        )
    return download(built, fmt, job_id[:10])


@router.get("/compare/{a}/{b}/diff.{fmt}")
async def diff_figure_file(a: JobId, b: JobId, fmt: Format, backend: BackendDep) -> Response:
    """The difference heatmap B − A."""
    ra, rb = await done_summary(backend, a), await done_summary(backend, b)
    problem = comparable(ra, rb)
    if problem:
        raise HTTPException(status.HTTP_409_CONFLICT, problem)
    return download(diff_figure(ra, rb), fmt, f"{a[:10]}-{b[:10]}")
