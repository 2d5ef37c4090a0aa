"""`icl-heads experiment NAME`: run one of the paper's dataset experiments from the shell.

A progress bar goes to stderr; `--json` prints the ExperimentResult on stdout; `--out DIR`
writes report.md, result.json, one CSV per table and an SVG and a PNG per figure.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from icl_heads.cli import remote as cli_remote
from icl_heads.cli.common import DeviceOption, DTypeOption, ModelOption, quietly, user_errors
from model_worker.common.errors import UserInputError
from model_worker.common.export_names import file_stems
from model_worker.common.export_text import csv_text
from model_worker.common.settings import get_settings
from model_worker.contracts.common import RankBy
from model_worker.contracts.evidence import Design, LabelStyle
from model_worker.contracts.experiments import (
    DEFAULT_N,
    EXPERIMENT_NAMES,
    PRECISE_N,
    ExperimentName,
    ExperimentRequest,
    ExperimentResult,
)
from model_worker.contracts.report import markdown_text, plain_text


def _per_label(demonstrations: int) -> int:
    """Demonstrations per label of `demonstrations` in all (4, 8 or 16)."""
    if demonstrations not in (4, 8, 16):
        raise UserInputError(f"--demonstrations must be 4, 8 or 16, got {demonstrations}")
    return demonstrations // 2


def write_outputs(result: ExperimentResult, out: Path) -> list[Path]:
    """Write report.md, result.json, `<table>.csv` and `<figure>.svg`/`.png` into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "report.md", out / "result.json"]
    written[0].write_text(markdown_text(result.report_blocks()), encoding="utf-8")
    written[1].write_text(result.model_dump_json(indent=1), encoding="utf-8")
    tables = file_stems(result.tables, "table")  # never a path from the result's keys
    for name, rows in result.tables.items():
        written.append(out / f"{tables[name]}.csv")
        written[-1].write_text(csv_text(rows), encoding="utf-8")
    # the figure kit imports altair (~0.7 s): only where figures are written, so that a bad
    # argument is refused at once (issue 28)
    from app.views.figure_kit.export import draw
    from app.views.figures.experiments import experiment_figure

    figures = file_stems(result.figures, "figure")
    for name, data in result.figures.items():
        figure = experiment_figure(name, data)  # drawn here from the result's data
        for fmt in ("svg", "png"):
            written.append(out / f"{figures[name]}.{fmt}")
            written[-1].write_bytes(draw(figure.spec("light", offscreen=True), fmt))
    return written


#: The request's fields `--server` sends as they are (`name` and `dataset` go apart: a local
#: dataset file travels inline).
REMOTE_OPTIONS = {
    "model",
    "n",
    "seed",
    "locate_by",
    "correct_only",
    "design",
    "demos_per_label",
    "labels",
}


def experiment(
    name: Annotated[ExperimentName, typer.Argument(help=f"One of: {', '.join(EXPERIMENT_NAMES)}.")],
    dataset: Annotated[
        str,
        typer.Option(
            "--dataset", "-d", help="sentiment-number, animal-country, or a CSV/JSONL file."
        ),
    ] = "sentiment-number",
    model: ModelOption = None,
    n: Annotated[
        int,
        typer.Option(
            "--n",
            min=1,
            max=1000,
            help=f"Prompts per prompt set (1–1000; {PRECISE_N} for ±5-point intervals, about "
            f"{PRECISE_N // DEFAULT_N}× the default's time).",
        ),
    ] = DEFAULT_N,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write report, JSON, CSVs, SVGs here.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the prompt sets.")] = 0,
    seeds: Annotated[
        str | None,
        typer.Option(
            "--seeds",
            help="Several seeds, e.g. 0,1,2: one run each, combined (spread between seeds, "
            "verdicts per seed). Overrides --seed.",
        ),
    ] = None,
    design: Annotated[
        Design,
        typer.Option(
            "--design",
            help="Demonstration orders: counterbalanced (every true/false arrangement equally "
            "often), or fftt (the paper's: true demonstrations nearest the input).",
        ),
    ] = "counterbalanced",
    demonstrations: Annotated[
        int,
        typer.Option(
            "--demonstrations",
            help="Demonstrations per prompt, half true and half false: 4 (the paper's), 8 or 16.",
        ),
    ] = 4,
    labels: Annotated[
        LabelStyle,
        typer.Option(
            "--labels",
            help="arbitrary: foo/bar (the paper's); meaningful: each class's own name "
            "(animal/country).",
        ),
    ] = "arbitrary",
    locate_by: Annotated[
        RankBy,
        typer.Option("--locate-by", help="Locate in-context heads by: increase, or label."),
    ] = "increase",
    correct_only: Annotated[
        bool,
        typer.Option("--correct-only", help="MRR and attention: correctly answered prompts only."),
    ] = False,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Prompts per pass.")] = 16,
    device: DeviceOption = "auto",
    dtype: DTypeOption = "auto",
    server: cli_remote.ServerOption = None,
) -> None:
    """Run one of the paper's dataset experiments over N prompts."""
    from pydantic import ValidationError
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from model_worker.experiments.job import run_experiment, run_seeds
    from model_worker.experiments.seeds import parse_seeds
    from model_worker.model.loading import load_model

    settings = get_settings()
    cache_dir = settings.cache_dir
    with user_errors():
        try:
            request = ExperimentRequest.model_validate(
                {
                    "name": name,
                    "dataset": dataset,
                    "model": model,
                    "n": n,
                    "seed": seed,
                    "locate_by": locate_by,
                    "correct_only": correct_only,
                    "design": design,
                    "demos_per_label": _per_label(demonstrations),
                    "labels": labels,
                }
            )
        except ValidationError as exc:
            raise UserInputError(exc.errors()[0]["msg"]) from None
        try:
            seed_list = parse_seeds(seeds) if seeds is not None else [seed]
        except ValueError as exc:
            raise UserInputError(str(exc)) from None
        if server is not None:  # the request's every option, seeds included, as run here
            asked = request.model_dump(include=REMOTE_OPTIONS)
            remote = cli_remote.experiment(
                server,
                name,
                dataset,
                **asked,
                **({"seeds": seed_list} if seeds is not None else {}),
            )
            return emit(remote, out, as_json)
        from model_worker.checks.arguments import check_model_source
        from model_worker.experiments.data import inline_dataset, resolve_dataset

        request = inline_dataset(request)  # a local file travels as text, like an upload
        resolve_dataset(request)  # a bad dataset fails before the model loads
        check_model_source(model)
        loaded = quietly(lambda: load_model(model, device=device, dtype=dtype, cache_dir=cache_dir))
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=Console(stderr=True), transient=as_json) as bar:
            task = bar.add_task(name, total=1.0)

            def progress(fraction: float, message: str) -> None:
                bar.update(task, completed=fraction, description=f"{name}: {message}")

            common = {"batch_size": batch_size, "max_tokens": settings.max_prompt_tokens}
            result = (
                run_experiment(loaded, request, progress, **common)
                if seeds is None
                else run_seeds(loaded, request, seed_list, progress, **common)
            )
    emit(result, out, as_json)


def emit(result: ExperimentResult, out: Path | None, as_json: bool) -> None:
    """Write `result` into `out`, and print it as JSON or (without `out`) its report; its
    warnings go to stderr."""
    for warning in result.warnings:
        typer.echo(f"warning ({warning.code}): {warning.message}", err=True)
    if out is not None:
        written = write_outputs(result, out)
        typer.echo(f"wrote {len(written)} files to {out}", err=True)
    if as_json:
        sys.stdout.write(result.model_dump_json() + "\n")
    elif out is None:
        typer.echo(plain_text(result.report_blocks()))


def register(app: typer.Typer) -> None:
    """Add `experiment` to the `icl-heads` command."""
    app.command()(experiment)
