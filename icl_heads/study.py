"""A study: several experiments × seeds as one submission, ending with the results document.

`paper_requests` lists the paper's experiments (the results document's sections) under every
seed; `run_study` hands them to a runner (a server: a few in flight at once, each spread over
the model's workers in chunks; or this process, one after another), combines each experiment's
seeds (model_worker.experiments.seeds), stores each under `folder` and renders
`folder/results.md` (icl_heads.results_doc): data in, one document out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from icl_heads.results_doc import TITLES, render, store
from model_worker.contracts.experiments import EXPERIMENT_NAMES, ExperimentRequest, ExperimentResult
from model_worker.experiments.seeds import combine_seeds

#: The studies by name: `paper` runs every experiment of the results document.
STUDIES = {"paper": tuple(name for name in TITLES if name in EXPERIMENT_NAMES)}
DOCUMENT = "results.md"


class Submitter(Protocol):
    """What `remote_runner` needs of `icl_heads.Client`."""

    def submit(self, request: ExperimentRequest) -> object: ...

    def wait(self, job_id: str, timeout: float | None = None) -> object: ...


def paper_requests(
    names: Sequence[str], dataset: str, seeds: Sequence[int], n: int, model: str | None
) -> list[ExperimentRequest]:
    """Every experiment of `names` under every seed (experiment by experiment)."""
    return [
        ExperimentRequest(name=name, dataset=dataset, n=n, seed=seed, model=model)
        for name in names
        for seed in seeds
    ]


Runner = Callable[[Sequence[ExperimentRequest]], list[ExperimentResult]]


def remote_runner(client: Submitter, in_flight: int = 2) -> Runner:
    """Run requests on a server, at most `in_flight` submitted at once (a client's share of
    experiments, ICL_CLIENT_EXPERIMENTS): results in request order."""

    def run(requests: Sequence[ExperimentRequest]) -> list[ExperimentResult]:
        results: dict[int, ExperimentResult] = {}
        waiting: list[tuple[int, str]] = []
        queued = list(enumerate(requests))
        while queued or waiting:
            while queued and len(waiting) < in_flight:
                index, request = queued.pop(0)
                state = client.submit(request)
                waiting.append((index, str(getattr(state, "id", ""))))
            index, job_id = waiting.pop(0)
            result = client.wait(job_id)
            if not isinstance(result, ExperimentResult):
                raise TypeError(f"job {job_id} is not an experiment")
            results[index] = result
        return [results[i] for i in range(len(requests))]

    return run


def run_study(requests: Sequence[ExperimentRequest], runner: Runner, folder: Path) -> Path:
    """Run `requests`, store each experiment's seeds combined under `folder`, and write the
    results document there; its path."""
    results = runner(requests)
    by_name: dict[str, list[ExperimentResult]] = {}
    for result in results:
        by_name.setdefault(result.name, []).append(result)
    for found in by_name.values():
        store(combine_seeds(found) if len(found) > 1 else found[0], folder)
    document = folder / DOCUMENT
    document.write_text(render(folder), encoding="utf-8")
    return document
