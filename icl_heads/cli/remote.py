"""`--server URL`: run `icl-heads analyze` / `experiment` / `study` on a shared server through
`icl_heads.Client` (token from `ICL_AUTH_TOKEN`); its errors become one `error: …` line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from model_worker.common.errors import UserInputError
from model_worker.contracts.analysis import AnalysisResult
from model_worker.contracts.experiments import ExperimentResult

if TYPE_CHECKING:
    from icl_heads.study import Study

ServerOption = Annotated[
    str | None,
    typer.Option("--server", help="Run on this icl-heads server (URL; token from ICL_AUTH_TOKEN)."),
]


@contextmanager
def _client(server: str, progress: bool) -> Iterator[Any]:
    from icl_heads.client import Client, ClientError

    try:
        with Client(server, progress=progress) as client:
            yield client
    except ClientError as exc:
        raise UserInputError(str(exc)) from None


def analyze(server: str, prompt: str, **options: Any) -> AnalysisResult:
    """`prompt` analysed on `server` (options as in `Client.analyze`)."""
    with _client(server, progress=False) as client:
        result: AnalysisResult = client.analyze(prompt, **options)
    return result


def experiment(server: str, name: str, dataset: str, **options: Any) -> ExperimentResult:
    """Experiment `name` on `server`, with a progress bar on stderr."""
    with _client(server, progress=True) as client:
        result: ExperimentResult = client.experiment(name, dataset, **options)
    return result


def study(server: str, **fields: Any) -> Study:
    """A study on `server` (fields as in `Client.study`), with a progress bar on stderr."""
    with _client(server, progress=True) as client:
        found: Study = client.study(**fields)
    return found
