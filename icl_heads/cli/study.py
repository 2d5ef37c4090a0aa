"""`icl-heads study paper`: the paper's experiments × seeds as one run, ending with the results
document (icl_heads.study). With `--server`, the study goes to that server (`POST /api/studies`:
its experiment jobs run on the server's workers, each spread over the model's workers in chunks,
within this client's share of batch work); without, they run here one after another."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from icl_heads.cli import remote as cli_remote
from icl_heads.cli.common import DeviceOption, DTypeOption, ModelOption, quietly, user_errors
from model_worker.common.errors import UserInputError
from model_worker.common.settings import get_settings
from model_worker.contracts.experiments import DEFAULT_N


def study(
    name: Annotated[str, typer.Argument(help="The study: paper (every experiment).")],
    model: ModelOption = None,
    dataset: Annotated[str, typer.Option(help="Built-in dataset.")] = "sentiment-number",
    seeds: Annotated[
        str, typer.Option(help="Seeds, e.g. 0,1,2 (pooled in each experiment).")
    ] = "0",
    n: Annotated[int, typer.Option("--n", help="Prompts per experiment and seed.")] = DEFAULT_N,
    out: Annotated[Path, typer.Option(help="Folder for the results and results.md.")] = Path(
        "study"
    ),
    device: DeviceOption = "auto",
    dtype: DTypeOption = "auto",
    server: cli_remote.ServerOption = None,
) -> None:
    """Run a study and write its results document."""
    from pydantic import ValidationError

    from icl_heads.study import STUDIES, run_here, write_study
    from model_worker.contracts.studies import StudyRequest
    from model_worker.experiments.seeds import parse_seeds

    with user_errors():
        if name not in STUDIES:
            raise UserInputError(f"unknown study {name!r}; use {', '.join(STUDIES)}")
        try:
            request = StudyRequest(
                model=model,
                experiments=list(STUDIES[name]),
                datasets=[dataset],
                seeds=parse_seeds(seeds),
                n=n,
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise UserInputError(f"{where}: {first['msg']}") from None
        except ValueError as exc:
            raise UserInputError(str(exc)) from None
        if server is not None:
            done = cli_remote.study(server, **request.model_dump(exclude_none=True))
        else:
            from model_worker.experiments.job import run_experiment
            from model_worker.model.loading import load_model

            cache_dir = get_settings().cache_dir
            loaded = quietly(
                lambda: load_model(model, device=device, dtype=dtype, cache_dir=cache_dir)
            )
            done = run_here(request, lambda plan: run_experiment(loaded, plan))
        document = write_study(done, out)
    typer.echo(f"wrote {document}", err=True)


def register(app: typer.Typer) -> None:
    """Add `study` to the `icl-heads` command."""
    app.command()(study)
