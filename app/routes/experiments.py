"""Dataset experiments in the dashboard: the form, the job page with a live progress bar
(HTMX polling), figures and report, downloads; and the JSON submit endpoint."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Form, HTTPException, Request, Response, UploadFile, status
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse
from markdown_it import MarkdownIt
from pydantic import ValidationError

from app.backend import Backend, BackendError, JobState, JobStatus
from app.contracts import EXPERIMENT_NAMES, ExperimentRequest, ExperimentResult
from app.deps import BackendDep, ClientDep, JobId
from app.export_text import csv_text
from app.routes.analyses import submit_responses, submitted
from app.templating import render
from model_worker.datasets import BUILTIN_DATASETS, MAX_BYTES, DatasetError, load_user_dataset

router = APIRouter(tags=["experiments"])

DESCRIPTIONS = {
    "accuracy": "ICL accuracy per input class and label assignment (Table 2)",
    "heads": "Top-20 heads by mean log-prob increase, overlap between datasets (Fig. 3/4)",
    "mrr": "Label-value MRR, in-context vs random heads of the same layer (Fig. 5)",
    "attention": "Attention on true vs false labels; attention vs increase (Fig. 6/7)",
    "imbalance": "Imbalanced prompts: attention on true/false labels (Fig. 8/10)",
    "reorder": "Re-ordered prompts: attention on true/false labels (Fig. 9/11)",
    "ablation": "Zero the in-context heads vs as many random heads",
    "bias": "Majority-label and recency bias reduction (later paper version)",
}
_markdown = MarkdownIt("commonmark", {"html": False}).enable("table")


def _form_page(
    request: Request,
    form: dict[str, Any] | None = None,
    error: str | None = None,
    status_code: int = 200,
) -> HTMLResponse:
    context = {
        "experiments": [(name, DESCRIPTIONS[name]) for name in EXPERIMENT_NAMES],
        "datasets": BUILTIN_DATASETS,
        "form": form or {"name": "accuracy", "dataset": BUILTIN_DATASETS[0], "n": 200},
        "error": error,
        "max_mb": MAX_BYTES // (1024 * 1024),
    }
    return render(request, "pages/experiments.html", context, status_code)


@router.get("/experiments", response_class=HTMLResponse)
async def experiments_page(request: Request) -> HTMLResponse:
    """Choose an experiment, a dataset (built in or uploaded) and N."""
    return _form_page(request)


async def _read_upload(upload: UploadFile) -> tuple[str, str]:
    """The uploaded file's text and name, validated as a dataset (DatasetError if unusable)."""
    data = await upload.read(MAX_BYTES + 1)
    name = upload.filename or "upload.csv"
    if len(data) > MAX_BYTES:
        raise DatasetError(f"file is larger than the limit of {MAX_BYTES:,} bytes")
    load_user_dataset(data, filename=name)  # raises DatasetError with the reason
    return data.decode("utf-8-sig"), name


@router.post("/experiments", response_class=HTMLResponse)
async def submit_experiment_form(
    request: Request,
    backend: BackendDep,
    client: ClientDep,
    name: Annotated[str, Form()] = "accuracy",
    dataset: Annotated[str, Form()] = "sentiment-number",
    n: Annotated[str, Form()] = "200",
    seed: Annotated[str, Form()] = "0",
    file: Annotated[UploadFile | None, File()] = None,
) -> Response:
    """Queue the experiment and go to its page (the form again, with the reason, if refused)."""
    form = {"name": name, "dataset": dataset, "n": n, "seed": seed}
    try:
        text = filename = None
        if dataset not in (*BUILTIN_DATASETS, "upload"):
            raise DatasetError(f"unknown dataset {dataset!r}; choose a built-in one or upload")
        if dataset == "upload":
            if file is None or not file.filename:
                raise DatasetError("choose a CSV or JSONL file to upload")
            text, filename = await _read_upload(file)
        experiment = ExperimentRequest.model_validate(
            {
                "name": name,
                "dataset": dataset,
                "n": n,
                "seed": seed,
                "dataset_text": text,
                "dataset_filename": filename,
            }
        )
        state = await backend.submit_experiment(experiment, client)
    except DatasetError as exc:
        return _form_page(request, form, str(exc), status.HTTP_400_BAD_REQUEST)
    except ValidationError as exc:
        problem = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return _form_page(request, form, problem, status.HTTP_400_BAD_REQUEST)
    except BackendError as exc:
        return _form_page(request, form, str(exc), exc.status)
    return RedirectResponse(f"/e/{state.id}", status_code=status.HTTP_303_SEE_OTHER)


def result_context(job_id: str, result: ExperimentResult) -> dict[str, Any]:
    """What the result partial renders from (`job_id` empty: no download links)."""
    return {
        "result": result,
        "report_html": _markdown.render(result.report_markdown),
        "figures": result.figures,
        "tables": list(result.tables),
        "job_id": job_id,
    }


async def _state(backend: Backend, job_id: str) -> JobState:
    state = await backend.status(job_id)
    if state is None or not job_id.startswith("e-"):
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"no experiment {job_id!r} (unknown or expired)"
        )
    return state


@router.get("/e/{job_id}", response_class=HTMLResponse)
async def experiment_job_page(job_id: JobId, request: Request, backend: BackendDep) -> HTMLResponse:
    """The experiment's permalink: figures and report when done, else a live progress bar."""
    state = await _state(backend, job_id)
    context: dict[str, Any] = {"job_id": job_id, "state": state}
    result = await _done_experiment(backend, state)
    if result is not None:
        context |= result_context(job_id, result)
    return render(request, "pages/experiment.html", context)


async def _done_experiment(backend: Backend, state: JobState) -> ExperimentResult | None:
    """The result of a done experiment (None while it runs or after it failed)."""
    return await backend.experiment(state.id) if state.status == JobStatus.DONE else None


@router.get("/e/{job_id}/status", response_class=HTMLResponse)
async def experiment_status(job_id: JobId, request: Request, backend: BackendDep) -> HTMLResponse:
    """HTMX poll target: the progress partial, or the whole result once done."""
    state = await _state(backend, job_id)
    context: dict[str, Any] = {"job_id": job_id, "state": state}
    result = await _done_experiment(backend, state)
    if result is not None:
        context |= result_context(job_id, result)
        return render(request, "partials/_experiment_result.html", context)
    return render(request, "partials/_experiment_status.html", context)


@router.get("/e/{job_id}/download/{item}")
async def experiment_download(job_id: JobId, item: str, backend: BackendDep) -> Response:
    """`report.md`, `result.json`, `<table>.csv`, `<figure>.svg` or `.png` of a done experiment."""
    result = await _done_experiment(backend, await _state(backend, job_id))
    if result is None:
        raise HTTPException(status.HTTP_409_CONFLICT, "the experiment has not finished")
    stem, _, suffix = item.rpartition(".")
    attachment = {"Content-Disposition": f'attachment; filename="{result.name}-{item}"'}
    if item == "report.md":
        return PlainTextResponse(result.report_markdown, headers=attachment)
    if item == "result.json":
        return Response(
            result.model_dump_json(indent=1), media_type="application/json", headers=attachment
        )
    if suffix == "csv" and stem in result.tables:
        return Response(
            csv_text(result.tables[stem]), media_type="text/csv; charset=utf-8", headers=attachment
        )
    if suffix == "png" and stem in result.figures:
        import resvg_py

        png = resvg_py.svg_to_bytes(svg_string=result.figures[stem], zoom=2.0, background="#fff")
        return Response(bytes(png), media_type="image/png", headers=attachment)
    if suffix == "svg" and stem in result.figures:
        return Response(result.figures[stem], media_type="image/svg+xml", headers=attachment)
    raise HTTPException(status.HTTP_404_NOT_FOUND, f"no download {item!r} in this experiment")


@router.post(
    "/api/experiments",
    response_model=JobState,
    responses=submit_responses("Invalid request (e.g. an unknown experiment or dataset)"),
    tags=["experiments"],
)
async def submit_experiment_json(
    experiment: ExperimentRequest, backend: BackendDep, client: ClientDep, response: Response
) -> Response | JobState:
    """200 with the result when cached, else 202 with the job id (poll /api/analyses/{id})."""
    try:
        if experiment.dataset == "upload":
            load_user_dataset(
                (experiment.dataset_text or "").encode("utf-8"),
                filename=experiment.dataset_filename or "upload.csv",
            )
        elif experiment.dataset not in BUILTIN_DATASETS:
            raise DatasetError(
                f"unknown dataset {experiment.dataset!r}; use {', '.join(BUILTIN_DATASETS)} "
                "or 'upload' with dataset_text and dataset_filename"
            )
    except DatasetError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc
    return await submitted(await backend.submit_experiment(experiment, client), backend, response)
