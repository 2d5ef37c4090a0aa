"""Dataset experiments in the dashboard: the form, the job page with a live progress bar
(HTMX polling), figures and report, downloads; and the JSON submit endpoint."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, cast

from fastapi import (
    APIRouter,
    File,
    Form,
    HTTPException,
    Query,
    Request,
    Response,
    UploadFile,
    status,
)
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse
from pydantic import ValidationError

from app.ascii_numbers import AsciiWhole, ascii_whole
from app.deps import BackendDep, ClientDep, ExperimentStateDep
from app.figure_files import ThemeQuery, cached_file, figure_response
from app.page_cache import finished_page, stray_parameters
from app.queue.interface import Backend, BackendError
from app.submission import ExperimentForm, form_problem, submit_responses, submitted
from app.templating import render, url_path
from app.views.figure_kit.export import FORMATS, Format
from app.views.figures.experiments import experiment_figure
from app.views.panels import ExperimentPanel
from model_worker.common.export_text import csv_text
from model_worker.contracts.experiments import (
    DEFAULT_N,
    EXPERIMENTS,
    PRECISE_N,
    ExperimentRequest,
    ExperimentResult,
)
from model_worker.contracts.report import markdown_text
from model_worker.datasets import BUILTIN_DATASETS, MAX_BYTES, DatasetError, load_user_dataset
from model_worker.service.queue.states import JobState, JobStatus

router = APIRouter(tags=["experiments"])


def _form_page(
    request: Request,
    form: dict[str, Any] | None = None,
    error: str | None = None,
    status_code: int = 200,
) -> HTMLResponse:
    context = {
        "experiments": [(name, spec.description) for name, spec in EXPERIMENTS.items()],
        "datasets": BUILTIN_DATASETS,
        "form": form or {"name": "accuracy", "dataset": BUILTIN_DATASETS[0], "n": DEFAULT_N},
        "sizes": {"quick": DEFAULT_N, "precise": PRECISE_N},
        "error": error,
        "max_mb": MAX_BYTES // (1024 * 1024),
    }
    return render(request, "pages/experiments.html", context, status_code)


@router.get("/experiments", response_class=HTMLResponse)
async def experiments_page(
    request: Request,
    n: Annotated[
        AsciiWhole | None, Query(ge=1, le=1000, description="Prompts, pre-filled.")
    ] = None,
) -> HTMLResponse:
    """Choose an experiment, a dataset (built in or uploaded) and N (`n`: pre-filled, as the
    page's size links ask)."""
    form = None if n is None else {"name": "accuracy", "dataset": BUILTIN_DATASETS[0], "n": n}
    return _form_page(request, form)


async def _read_upload(upload: UploadFile) -> tuple[str, str]:
    """The uploaded file's text and name, validated as a dataset (DatasetError if unusable)."""
    data = await upload.read(MAX_BYTES + 1)
    name = upload.filename or "upload.csv"
    if len(data) > MAX_BYTES:
        raise DatasetError(f"file is larger than the limit of {MAX_BYTES:,} bytes")
    load_user_dataset(data, filename=name)  # raises DatasetError with the reason
    return data.decode("utf-8-sig"), name


#: The experiment form's fields that are whole numbers (typed as text, shown again if refused).
WHOLE_FIELDS = ("n", "seed", "demos_per_label")


@router.post("/experiments", response_class=HTMLResponse)
async def submit_experiment_form(
    request: Request,
    backend: BackendDep,
    client: ClientDep,
    typed: Annotated[ExperimentForm, Form()],
    file: Annotated[UploadFile | None, File()] = None,
) -> Response:
    """Queue the experiment and go to its page (the form again, with the reason, if refused)."""
    form = typed.model_dump()
    for field in WHOLE_FIELDS:
        if ascii_whole(form[field]) is None:
            problem = f"{field} must be a whole number in the digits 0-9"
            return _form_page(request, form, problem, status.HTTP_400_BAD_REQUEST)
    dataset = typed.dataset
    try:
        text = filename = None
        if dataset not in (*BUILTIN_DATASETS, "upload"):
            raise DatasetError(f"unknown dataset {dataset!r}; choose a built-in one or upload")

        if dataset == "upload":
            if file is None or not file.filename:
                raise DatasetError("choose a CSV or JSONL file to upload")
            text, filename = await _read_upload(file)
        experiment = ExperimentRequest.model_validate(
            {**form, "dataset_text": text, "dataset_filename": filename}
        )
        state = await backend.submit_experiment(experiment, client)
    except DatasetError as exc:
        return _form_page(request, form, str(exc), status.HTTP_400_BAD_REQUEST)
    except ValidationError as exc:
        return _form_page(request, form, form_problem(exc), status.HTTP_400_BAD_REQUEST)
    except BackendError as exc:
        return _form_page(request, form, str(exc), exc.status)
    target = url_path(request, "experiment_job_page", job_id=state.id)
    return RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)


async def _done_experiment(backend: Backend, state: JobState) -> ExperimentResult | None:
    """The result of a done experiment (None while it runs or after it failed)."""
    return await backend.experiment(state.id) if state.status == JobStatus.DONE else None


async def _pending_context(backend: Backend, state: JobState) -> dict[str, Any]:
    """A running (or failed) job's context: its state and its accepted request (`pending`),
    which names it in the heading."""
    accepted = await backend.accepted_request(state.id)
    pending = accepted if isinstance(accepted, ExperimentRequest) else None
    return {"job_id": state.id, "state": state, "done": False, "pending": pending}


async def _experiment_html(
    request: Request, backend: Backend, client: str, state: JobState, template: str
) -> Response:
    """`template` for the experiment: once done, kept and built off the loop (its panel too);
    until then its progress."""
    twin = url_path(request, "get_analysis", job_id=state.id)
    if state.status != JobStatus.DONE:
        context = await _pending_context(backend, state)
        return render(request, template, context, alternate=twin)

    async def prepare() -> Callable[[], Response]:
        result = await _done_experiment(backend, state)
        if result is None:  # pruned since it read done
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no experiment {state.id!r}")

        def build() -> Response:
            context = {"job_id": state.id, "state": state, "done": True}
            context["experiment"] = ExperimentPanel.of(result, state.id)
            return render(request, template, context, alternate=twin)

        return build

    return await finished_page(request, client, prepare)


@router.get("/e/{job_id}", response_class=HTMLResponse)
async def experiment_job_page(
    request: Request, state: ExperimentStateDep, backend: BackendDep, client: ClientDep
) -> Response:
    """The experiment's permalink: figures and report when done, else a live progress bar."""
    if (moved := stray_parameters(request, ())) is not None:
        return moved
    return await _experiment_html(request, backend, client, state, "pages/experiment.html")


@router.get("/e/{job_id}/status", response_class=HTMLResponse)
async def experiment_status(
    request: Request, state: ExperimentStateDep, backend: BackendDep, client: ClientDep
) -> Response:
    """HTMX poll target: the progress partial, or the whole result once done."""
    done = state.status == JobStatus.DONE
    template = "partials/_experiment_result.html" if done else "partials/_experiment_status.html"
    return await _experiment_html(request, backend, client, state, template)


@router.get("/e/{job_id}/download/{item}")
async def experiment_download(
    request: Request,
    item: str,
    state: ExperimentStateDep,
    backend: BackendDep,
    theme: ThemeQuery = "light",
) -> Response:
    """`report.md`, `result.json`, `<table>.csv`, or a figure as `<figure>.svg`, `.png`, `.csv`
    (its data) or `.json` (its Vega-Lite specification) of a done experiment."""
    figure_file = item.rpartition(".")[2] in FORMATS
    if figure_file and (served := await cached_file(request, theme)) is not None:
        return served  # (a figure file served before: no result read, no figure built)
    result = await _done_experiment(backend, state)
    if result is None:
        raise HTTPException(status.HTTP_409_CONFLICT, "the experiment has not finished")
    stem, _, suffix = item.rpartition(".")
    attachment = {"Content-Disposition": f'attachment; filename="{result.name}-{item}"'}
    if item == "report.md":
        return PlainTextResponse(markdown_text(result.report_blocks()), headers=attachment)
    if item == "result.json":
        return Response(
            result.model_dump_json(indent=1), media_type="application/json", headers=attachment
        )
    if suffix == "csv" and stem in result.tables:
        return Response(
            csv_text(result.tables[stem]), media_type="text/csv; charset=utf-8", headers=attachment
        )
    if suffix in FORMATS and stem in result.figures:
        figure = experiment_figure(stem, result.figures[stem])
        fmt = cast(Format, suffix)
        return await figure_response(request, figure, fmt, theme, f"{result.name}-{item}")
    raise HTTPException(status.HTTP_404_NOT_FOUND, f"no download {item!r} in this experiment")


@router.get("/e/{job_id}/figures/{name}.{fmt}")
async def experiment_figure_file(
    request: Request,
    name: str,
    fmt: Format,
    state: ExperimentStateDep,
    backend: BackendDep,
    theme: ThemeQuery = "light",
) -> Response:
    """Figure `name` of a done experiment as SVG, PNG, CSV (its data) or JSON (its Vega-Lite
    specification)."""
    if (served := await cached_file(request, theme)) is not None:
        return served  # (a figure file served before: no result read, no figure built)
    result = await _done_experiment(backend, state)
    if result is None:
        raise HTTPException(status.HTTP_409_CONFLICT, "the experiment has not finished")
    if name not in result.figures:
        known = ", ".join(result.figures) or "none"
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no figure {name!r}; this has: {known}")
    figure = experiment_figure(name, result.figures[name])
    return await figure_response(request, figure, fmt, theme, f"{result.name}-{name}.{fmt}")


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
