"""`icl-heads`'s engine commands: analyze, models, experiment, worker. Bad input prints one line
and exits with code 2. The package (`icl_heads.cli`) adds `worker`, `experiment` and `serve`."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from icl_heads.cli import remote as cli_remote
from icl_heads.cli.common import (
    DeviceOption,
    DTypeOption,
    ModelOption,
    OneLineErrors,
    quietly,
    user_errors,
)
from model_worker.common.settings import get_settings
from model_worker.contracts.common import NormMode, RankBy

app = typer.Typer(
    cls=OneLineErrors,
    help="Find and explain the in-context heads of language models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def main() -> None:
    """ICL Heads Explorer: analyse prompts, serve the dashboard, run workers and experiments."""


@app.command()
def analyze(
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="The ICL prompt to analyse.")],
    model: ModelOption = None,
    target: Annotated[
        str | None, typer.Option(help="Analyse this token, not the prediction.")
    ] = None,
    labels: Annotated[
        str | None, typer.Option(help="Comma-separated labels, e.g. foo,bar.")
    ] = None,
    expected: Annotated[
        str | None,
        typer.Option(help="The right answer: say whether the prediction is it."),
    ] = None,
    norm: Annotated[NormMode, typer.Option(help="Final-norm scale: fixed or recompute.")] = "fixed",
    top_k: Annotated[
        int, typer.Option("--top-k", min=1, help="Heads with per-position detail.")
    ] = 20,
    rank_by: Annotated[
        RankBy,
        typer.Option(
            "--rank-by", "--rank", help="Rank heads by: increase, or label (label increase)."
        ),
    ] = "increase",
    device: DeviceOption = "auto",
    dtype: DTypeOption = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    server: cli_remote.ServerOption = None,
) -> None:
    """Locate the in-context heads of one prompt and project them into the vocabulary."""
    from model_worker.checks.arguments import check_analysis_arguments, check_model_source

    label_list = [x.strip() for x in labels.split(",") if x.strip()] if labels else None
    with user_errors():  # bad arguments: exit 2 at once, before torch or a model loads
        check_analysis_arguments(
            prompt,
            target=target,
            labels=label_list,
            top_k_heads=top_k,
            rank_by=rank_by,
            expected=expected,
        )
        if server is None:
            check_model_source(model)
    settings = get_settings()  # a bad ICL_* variable is refused before torch too
    from icl_heads.cli.tables import print_result
    from model_worker.model.loading import load_model
    from model_worker.run.analyze import analyze as run_analysis

    with user_errors():
        options: dict[str, Any] = {
            "target": target,
            "labels": label_list,
            "expected": expected,
            "norm": norm,
            "top_k_heads": top_k,
            "rank_by": rank_by,
            "label_keys": "all",  # the whole result (the dashboard computes them on demand)
        }
        if server is not None:
            result = cli_remote.analyze(server, prompt, model=model, **options)
        else:
            loaded = quietly(
                lambda: load_model(model, device=device, dtype=dtype, cache_dir=settings.cache_dir)
            )
            result = run_analysis(loaded, prompt, max_tokens=settings.max_prompt_tokens, **options)
    if as_json:
        sys.stdout.write(result.model_dump_json() + "\n")
    else:
        print_result(result)


@app.command()
def models(
    as_json: Annotated[bool, typer.Option("--json", help="Print the catalog as JSON.")] = False,
) -> None:
    """List the supported model families (model_type) and what was verified for each."""
    import json

    from model_worker.model.adapters import catalog

    families = catalog()
    if as_json:
        sys.stdout.write(json.dumps(families) + "\n")
        return
    for entry in families:
        typer.echo(f"{entry['family']:<12} {entry['title']:<20} {entry['block']}")
        typer.echo(f"{'':<12} {', '.join(entry['features'])}")
        typer.echo(f"{'':<12} e.g. {', '.join(entry['examples'])}")
        verified = entry["verified"]
        real = verified["real_checkpoints"]
        typer.echo(f"{'':<12} verified on a tiny random checkpoint (fp32, both norm modes)")
        typer.echo(f"{'':<12} " + "; ".join(verified["tiny_random_fp32"]))
        names = [configuration["name"] for configuration in verified["configurations"]]
        typer.echo(f"{'':<12} in the configurations: " + "; ".join(names))
        if verified["rope_types"]:
            typer.echo(f"{'':<12} rotary scaling: " + ", ".join(verified["rope_types"]))
        if real:
            typer.echo(f"{'':<12} and on {', '.join(real)}")
