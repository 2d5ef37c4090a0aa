"""A study: several experiments × datasets × seeds as one run, ending with the results document.

`StudyRequest` (model_worker.contracts.studies) plans it: one experiment job per experiment and
dataset, every seed in each, pooled (the verdicts decided over every seed's prompts). On a
server (`Client.study`: `POST /api/studies`) the server runs the jobs, within the client's share
of batch work, each spread over the model's workers in chunks, and renders the document; here
(`run_here`) they run one after another. Either way `study_document` renders the document from
the results (icl_heads.results_doc) and `write_study` keeps them in a folder: data in, one
document out.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from icl_heads.results_doc import render, store
from model_worker.contracts.experiments import ExperimentRequest, ExperimentResult
from model_worker.contracts.studies import PAPER_EXPERIMENTS, StudyRequest

#: The studies by name: `paper` runs every experiment of the results document.
STUDIES = {"paper": PAPER_EXPERIMENTS}
DOCUMENT = "results.md"


@dataclass(frozen=True)
class Study:
    """A finished study: its id on the server (empty when run here), its results document and
    its experiments' results (in its plan's order)."""

    id: str
    document: str
    results: list[ExperimentResult]


def _by_dataset(results: Sequence[ExperimentResult]) -> dict[str, list[ExperimentResult]]:
    found: dict[str, list[ExperimentResult]] = {}
    for result in results:
        found.setdefault(result.dataset, []).append(result)
    return found


def study_document(results: Sequence[ExperimentResult]) -> str:
    """The results document of a study's results: one document per dataset (in the order the
    results name them), separated by a rule."""
    documents = []
    for found in _by_dataset(results).values():
        with tempfile.TemporaryDirectory() as folder:
            for result in found:
                store(result, Path(folder))
            documents.append(render(Path(folder)))
    return "\n\n---\n\n".join(documents)


def write_study(study: Study, folder: Path) -> Path:
    """Keep each result under `folder` (several datasets: `folder/<dataset>/`) and write the
    results document there; its path."""
    by_dataset = _by_dataset(study.results)
    for dataset, found in by_dataset.items():
        for result in found:
            store(result, folder if len(by_dataset) == 1 else folder / dataset)
    document = folder / DOCUMENT
    folder.mkdir(parents=True, exist_ok=True)
    document.write_text(study.document, encoding="utf-8")
    return document


def run_here(request: StudyRequest, run: Callable[[ExperimentRequest], ExperimentResult]) -> Study:
    """The study with every experiment job run by `run` in this process, one after another."""
    results = [run(plan) for plan in request.experiment_requests()]
    return Study(id="", document=study_document(results), results=results)
