"""`icl-heads`: the command line. Bad input prints one line and exits with code 2."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import typer

from app.contracts import NormMode
from model_worker import cli_experiments, cli_remote, cli_service
from model_worker.errors import UserInputError

app = typer.Typer(
    help="Find and explain the in-context heads of language models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

T = TypeVar("T")


@app.callback()
def main() -> None:
    """ICL Heads Explorer: analyse prompts, serve the dashboard, run workers and experiments."""


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a UserInputError into `error: …` on stderr and exit code 2."""
    try:
        yield
    except UserInputError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def quietly(load: Callable[[], T]) -> T:
    """Run `load` with transformers' progress bars and warnings silenced."""
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hub_logging.set_verbosity_error()
    return load()


ModelOption = Annotated[
    str | None,
    typer.Option("--model", "-m", help="HF id, local folder or .gguf (default SmolLM2)."),
]


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
    norm: Annotated[str, typer.Option(help="fixed or recompute.")] = "fixed",
    top_k: Annotated[int, typer.Option("--top-k", help="Heads with per-position detail.")] = 20,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:0 …")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    server: cli_remote.ServerOption = None,
) -> None:
    """Locate the in-context heads of one prompt and project them into the vocabulary."""
    from model_worker.analyze import analyze as run_analysis
    from model_worker.loading import load_model
    from model_worker.report import print_result

    with user_errors():
        if norm not in ("fixed", "recompute"):
            raise UserInputError(f"--norm must be fixed or recompute, not {norm!r}")
        if top_k < 1:
            raise UserInputError("--top-k must be at least 1")
        label_list = [x.strip() for x in labels.split(",") if x.strip()] if labels else None
        mode: NormMode = "fixed" if norm == "fixed" else "recompute"
        options: dict[str, Any] = {
            "target": target,
            "labels": label_list,
            "norm": mode,
            "top_k_heads": top_k,
        }
        if server is not None:
            result = cli_remote.analyze(server, prompt, model=model, **options)
        else:
            loaded = quietly(lambda: load_model(model, device=device, dtype=dtype))
            result = run_analysis(loaded, prompt, **options)
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

    from model_worker.adapters import catalog

    families = catalog()
    if as_json:
        sys.stdout.write(json.dumps(families) + "\n")
        return
    for entry in families:
        typer.echo(f"{entry['family']:<12} {entry['title']:<20} {entry['block']}")
        typer.echo(f"{'':<12} {', '.join(entry['features'])}")
        typer.echo(f"{'':<12} e.g. {', '.join(entry['examples'])}")
        real = entry["verified"]["real_checkpoints"]
        typer.echo(f"{'':<12} verified on a tiny random checkpoint (fp32, both norm modes)")
        typer.echo(f"{'':<12} " + "; ".join(entry["verified"]["tiny_random_fp32"]))
        if real:
            typer.echo(f"{'':<12} and on {', '.join(real)}")


cli_service.register(app)
cli_experiments.register(app)

if __name__ == "__main__":
    app()
