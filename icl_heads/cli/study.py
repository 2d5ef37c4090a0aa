"""`icl-heads study paper`: the paper's experiments × seeds as one run, ending with the results
document (icl_heads.study). With `--server`, the experiments go to that server's workers (each
spread over the model's workers in chunks); without, they run here one after another."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from icl_heads.cli import remote as cli_remote
from icl_heads.cli.common import DeviceOption, DTypeOption, ModelOption, quietly, user_errors
from model_worker.common.errors import UserInputError
from model_worker.common.settings import get_settings


def study(
    name: Annotated[str, typer.Argument(help="The study: paper (every experiment).")],
    model: ModelOption = None,
    dataset: Annotated[str, typer.Option(help="Built-in dataset.")] = "sentiment-number",
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 0,1,2.")] = "0",
    n: Annotated[int, typer.Option("--n", help="Prompts per experiment.")] = 64,
    out: Annotated[Path, typer.Option(help="Folder for the results and results.md.")] = Path(
        "study"
    ),
    in_flight: Annotated[
        int, typer.Option(help="Experiments submitted at once to a server (its client share).")
    ] = 2,
    device: DeviceOption = "auto",
    dtype: DTypeOption = "auto",
    server: cli_remote.ServerOption = None,
) -> None:
    """Run a study and write its results document."""
    from pydantic import ValidationError

    from icl_heads.study import STUDIES, paper_requests, remote_runner, run_study
    from model_worker.experiments.seeds import parse_seeds

    with user_errors():
        if name not in STUDIES:
            raise UserInputError(f"unknown study {name!r}; use {', '.join(STUDIES)}")
        try:
            seed_list = parse_seeds(seeds)
            requests = paper_requests(STUDIES[name], dataset, seed_list, n, model)
        except (ValueError, ValidationError) as exc:
            raise UserInputError(str(exc).splitlines()[0]) from None
        if server is not None:
            from icl_heads.client import Client

            with Client(server) as client:
                document = run_study(requests, remote_runner(client, in_flight), out)
        else:
            from model_worker.experiments.job import run_experiment
            from model_worker.model.loading import load_model

            cache_dir = get_settings().cache_dir
            loaded = quietly(
                lambda: load_model(model, device=device, dtype=dtype, cache_dir=cache_dir)
            )
            document = run_study(
                requests, lambda asked: [run_experiment(loaded, r) for r in asked], out
            )
    typer.echo(f"wrote {document}", err=True)


def register(app: typer.Typer) -> None:
    """Add `study` to the `icl-heads` command."""
    app.command()(study)
