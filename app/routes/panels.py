"""HTMX partials of an analysis (status, tokens, layers, heatmap, top heads, head panel) and
their JSON twins under `/api/analyses/{id}/...`."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from fastapi.responses import HTMLResponse

from app.backend import Backend, JobState, JobStatus
from app.contracts import (
    AnalysisCore,
    AnalysisRequest,
    AnalysisResult,
    AnalysisSummary,
    HeadDetail,
)
from app.deps import BackendDep, ClientDep, JobId, JobIdQuery
from app.figures.analysis import (
    attention_figure,
    flow_figure,
    heatmap_figure,
    increase_figure,
    layers_figure,
    margin_figure,
    ranked_demonstrations,
    scores_figure,
)
from app.result_parts import detail_mrr
from app.templating import render

router = APIRouter(tags=["panels"])
HEAD_NAME = re.compile(r"L(\d{1,4})H(\d{1,4})")


async def job_state(backend: Backend, job_id: str) -> JobState:
    """The job's state; 404 with a clear message if it is unknown or expired."""
    state = await backend.status(job_id)
    if state is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"no analysis {job_id!r} (unknown or expired)"
        )
    return state


async def next_state(
    backend: Backend,
    job_id: str,
    wait_s: float,
    interval_s: float = 0.05,
    gone: Callable[[], Awaitable[bool]] | None = None,
) -> JobState:
    """The job's state as soon as it ends or reports news (its per-head stage among them:
    the message DETAILS_MESSAGE), else after `wait_s` (a long poll: the page learns of the
    result within `interval_s` instead of at its next poll). Stops early once `gone()` says
    the client went away (its answer would be thrown away)."""
    first = state = await job_state(backend, job_id)
    deadline = time.monotonic() + wait_s
    news = ("status", "progress", "message", "position_in_queue")
    while state.status in (JobStatus.QUEUED, JobStatus.RUNNING) and time.monotonic() < deadline:
        await asyncio.sleep(interval_s)
        if gone is not None and await gone():
            break
        state = await job_state(backend, job_id)
        if any(getattr(state, key) != getattr(first, key) for key in news):
            break
    return state


async def heads_stage(backend: Backend, state: JobState) -> AnalysisSummary | None:
    """The per-head stage of a running analysis (no head details yet), once it is done."""
    return await backend.heads_stage(state.id) if state.status == JobStatus.RUNNING else None


async def done_summary(backend: Backend, job_id: str) -> AnalysisSummary:
    """The finished analysis `job_id` without its head details; 404 if unknown, 409 if not
    finished or failed."""
    state = await job_state(backend, job_id)
    if state.status == JobStatus.FAILED:
        raise HTTPException(status.HTTP_409_CONFLICT, f"analysis {job_id} failed: {state.error}")
    found = await backend.summary(job_id) if state.status == JobStatus.DONE else None
    if found is None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"analysis {job_id} is {state.status}")
    return found


def check_head(result: AnalysisCore, name: str) -> str:
    """`name` if the model has that head, else 404 with what exists."""
    match = HEAD_NAME.fullmatch(name)
    if not match or int(match[1]) >= result.n_layers or int(match[2]) >= result.n_heads:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"no head {name!r}: heads are L0H0 … L{result.n_layers - 1}H{result.n_heads - 1}",
        )
    return name


def head_parameter(name: str | None) -> str | None:
    """A `?head=` value (it goes into an hx-get URL): None, or a head name; else 422."""
    if name is not None and not HEAD_NAME.fullmatch(name):
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"?head= must name a head such as L0H1, not {name[:40]!r}",
        )
    return name


def analysis_context(
    job_id: str, result: AnalysisSummary | AnalysisResult, link: bool = True
) -> dict[str, Any]:
    """Everything the analysis body and its panels render from (`link`: clickable cells)."""
    kinds = {label.position: "true" if label.is_true else "false" for label in result.labels}
    top = [result.head(name) for name in result.top_heads]
    detailed = detail_mrr(result)
    mrr = {name: {m.label: m.mrr for m in values} for name, values in detailed.items()}
    return {
        "job_id": job_id,
        "result": result,
        "kinds": kinds,
        "last": len(result.tokens) - 1,
        "top": top,
        "mrr": mrr,
        "mrr_labels": list(dict.fromkeys(m.label for values in detailed.values() for m in values)),
        "heatmap": heatmap_figure(result, focusable=link),
        "heads_url": f"/a/{job_id}" if link else None,
        "layers": layers_figure(result),
        "flow": flow_figure(result),
    }


def extra_head_request(
    result: AnalysisSummary, name: str, model: str | None, top_k_tokens: int
) -> AnalysisRequest:
    """The request that reproduces `result` (same prompt and options) with `name` detailed:
    the stored request when the result has one, else one rebuilt from the result (with
    `top_k_tokens`, what its details show)."""
    if result.request is not None:
        return result.request.model_copy(update={"model": model, "extra_heads": [name]})
    words = sorted({label.word for label in result.labels})
    return AnalysisRequest(
        prompt=result.prompt,
        model=model,
        target=result.target.token if result.target.source == "given" else None,
        labels=words or None,
        norm=result.norm,
        top_k_heads=max(1, len(result.top_heads)),
        top_k_tokens=top_k_tokens,
        extra_heads=[name],
        rank=result.rank_by,
    )


async def stored_detail(backend: Backend, job_id: str, name: str) -> HeadDetail:
    """Head `name`'s detail from the done analysis `job_id` (409 if it lacks it)."""
    detail = await backend.head_detail(job_id, name)
    if detail is None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"analysis {job_id} lacks {name}")
    return detail


async def find_head(
    backend: Backend, job_id: str, name: str, job: str | None, client: str
) -> tuple[AnalysisSummary, str, HeadDetail | None, JobState | None]:
    """(result, id holding the detail, detail or None while pending, the extra job's state).

    A head outside the stored details is computed by a second analysis with
    `extra_heads=[name]`; `job` is that analysis' id once submitted. While the analysis
    itself is still computing its head details, it is the job to wait for.
    """
    state = await job_state(backend, job_id)
    partial = await heads_stage(backend, state)
    if partial is not None:
        check_head(partial, name)
        return partial, job_id, None, state
    result = await done_summary(backend, job_id)
    check_head(result, name)
    if name in result.detail_mrr:
        return result, job_id, await stored_detail(backend, job_id, name), None
    if job is None or job == job_id:
        served = {info.name for info in await backend.models()}
        model = result.model if result.model in served else None
        top_k_tokens = 10
        if result.request is None and result.detail_mrr:
            top_k_tokens = len(
                (await stored_detail(backend, job_id, next(iter(result.detail_mrr)))).query
            )
        request = extra_head_request(result, name, model, top_k_tokens)
        extra = await backend.submit(request, client)
    else:
        extra = await job_state(backend, job)
    if extra.status == JobStatus.DONE:
        return result, extra.id, await stored_detail(backend, extra.id, name), extra
    return result, extra.id, None, extra


def head_context(
    job_id: str, result: AnalysisCore, source_id: str, detail: HeadDetail
) -> dict[str, Any]:
    summary = result.head(detail.name)
    built = [
        attention_figure(result, detail),
        scores_figure(result, detail),
        increase_figure(result, detail),
        margin_figure(result, detail),
    ]
    figures = [f for f in built if f is not None]
    return {
        "job_id": job_id,
        "source_id": source_id,
        "result": result,
        "detail": detail,
        "summary": summary,
        "figures": figures,
        "kinds": {label.position: label.is_true for label in result.labels},
        "demonstrations": ranked_demonstrations(result, detail),
    }


# --- HTML partials -------------------------------------------------------------------------


@router.get("/a/{job_id}/status", response_class=HTMLResponse)
async def status_panel(
    job_id: JobId,
    request: Request,
    backend: BackendDep,
    wait: Annotated[float, Query(ge=0, le=30, description="Long-poll up to this many s.")] = 0,
    after: Annotated[
        Literal["heads"] | None,
        Query(description="The page shows the per-head stage: answer with the details' state."),
    ] = None,
) -> Response:
    """While queued/running: a poller that re-requests itself; once the per-head stage is
    done: the analysis body without head details, whose own poller (`after=heads`) learns when
    they are done and then fetches the whole body; when done: the whole body."""
    state = await next_state(backend, job_id, wait, gone=request.is_disconnected)
    if after == "heads" and state.status != JobStatus.FAILED:
        ready = state.status == JobStatus.DONE
        template = "partials/_details_ready.html" if ready else "partials/_details_pending.html"
        return render(request, template, {"job_id": job_id})
    partial = await heads_stage(backend, state)
    result = await backend.summary(job_id) if state.status == JobStatus.DONE else partial
    if result is not None:
        context = analysis_context(job_id, result) | {
            "pending": partial is not None,
            "open_head": open_head(request, result),
        }
        return render(request, "partials/_analysis_body.html", context)
    return render(request, "partials/_status.html", {"job_id": job_id, "state": state})


def open_head(request: Request, result: AnalysisCore) -> str | None:
    """The head the page has open (`?head=` of the page's URL, which htmx sends as
    HX-Current-URL), so that a body replacing the page's keeps it open; None unless it is a
    head of this model."""
    query = urlsplit(request.headers.get("HX-Current-URL", "")).query
    head = parse_qs(query).get("head", [""])[0]
    match = HEAD_NAME.fullmatch(head)
    if match is None or int(match[1]) >= result.n_layers or int(match[2]) >= result.n_heads:
        return None
    return head


def _panel(name: str) -> Callable[..., Awaitable[Response]]:
    async def panel(job_id: JobId, request: Request, backend: BackendDep) -> Response:
        result = await done_summary(backend, job_id)
        return render(request, f"partials/_{name}.html", analysis_context(job_id, result))

    panel.__name__ = f"{name.replace('-', '_')}_panel"
    return panel


for _name in ("tokens", "layers", "flow", "heatmap", "top_heads"):
    router.add_api_route(
        f"/a/{{job_id}}/panels/{_name.replace('_', '-')}",
        _panel(_name),
        methods=["GET"],
        response_class=HTMLResponse,
    )


@router.get("/a/{job_id}/heads/{name}", response_class=HTMLResponse)
async def head_panel(
    job_id: JobId,
    name: str,
    request: Request,
    backend: BackendDep,
    client: ClientDep,
    job: JobIdQuery | None = None,
) -> Response:
    """A head's panel; polls while a head outside the stored details is being computed."""
    result, source_id, detail, extra = await find_head(backend, job_id, name, job, client)
    if detail is None:
        assert extra is not None
        context = {"job_id": job_id, "name": name, "state": extra}
        return render(request, "partials/_head_pending.html", context)
    return render(request, "partials/_head.html", head_context(job_id, result, source_id, detail))


# --- JSON twins ----------------------------------------------------------------------------


@router.get("/api/analyses/{job_id}/tokens")
async def tokens_json(job_id: JobId, backend: BackendDep) -> dict[str, Any]:
    result = await done_summary(backend, job_id)
    return {
        "tokens": [t.model_dump() for t in result.tokens],
        "labels": [label.model_dump() for label in result.labels],
        "target": result.target.model_dump(),
        "separator": result.separator,
        "warnings": result.warnings,
    }


@router.get("/api/analyses/{job_id}/layers")
async def layers_json(job_id: JobId, backend: BackendDep) -> dict[str, Any]:
    result = await done_summary(backend, job_id)
    return {"layers": [x.model_dump() for x in result.layers]}


@router.get("/api/analyses/{job_id}/flow")
async def flow_json(job_id: JobId, backend: BackendDep) -> dict[str, Any]:
    result = await done_summary(backend, job_id)
    return {"flow": [x.model_dump() for x in result.flow]}


@router.get("/api/analyses/{job_id}/heatmap")
async def heatmap_json(job_id: JobId, backend: BackendDep) -> dict[str, Any]:
    result = await done_summary(backend, job_id)
    return {
        "n_layers": result.n_layers,
        "n_heads": result.n_heads,
        "heads": [h.model_dump() for h in result.heads],
    }


@router.get("/api/analyses/{job_id}/top-heads")
async def top_heads_json(job_id: JobId, backend: BackendDep) -> dict[str, Any]:
    result = await done_summary(backend, job_id)
    return {
        "top_heads": [
            {
                **result.head(name).model_dump(),
                "value_mrr": [m.model_dump() for m in result.detail_mrr.get(name, [])],
            }
            for name in result.top_heads
        ]
    }


@router.get("/api/analyses/{job_id}/heads/{name}")
async def head_json(
    job_id: JobId,
    name: str,
    backend: BackendDep,
    client: ClientDep,
    response: Response,
    job: JobIdQuery | None = None,
) -> dict[str, Any]:
    """The head's detail (200), or 202 with the id of the analysis computing it (poll `job`)."""
    result, source_id, detail, extra = await find_head(backend, job_id, name, job, client)
    if detail is None:
        assert extra is not None
        response.status_code = status.HTTP_202_ACCEPTED
        return {"status": extra.status, "job": extra.id, "error": extra.error}
    return {
        "status": "done",
        "job": source_id,
        "summary": result.head(name).model_dump(),
        "detail": detail.model_dump(),
    }
