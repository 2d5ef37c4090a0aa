"""The passes that work on one prompt at a time (the atlas' function vectors and saliency, the
towers' decompositions, the patching experiment's attribution and exact patching) go in slices
like the batched ones: a slicer's checkpoint comes between two of their prompts, so an
interactive job runs and a cancel stops the experiment there, not after the pass (issue 40)."""

from __future__ import annotations

import pytest

from model_worker.common.errors import JobCancelled, cancelled_message
from model_worker.contracts.experiments import ExperimentRequest
from model_worker.experiments.job import run_experiment
from model_worker.experiments.slices import Slicer
from tests.tiny_models import tiny_llama

WORDS = {"sentiment": ["love", "like", "hate", "good", "bad"], "number": ["one", "two", "four"]}
TINY_CSV = "text,label\n" + "".join(f"{w},{c}\n" for c, ws in WORDS.items() for w in ws)
N = 8


def request(name: str) -> ExperimentRequest:
    return ExperimentRequest(
        name=name, dataset="upload", n=N, seed=1, dataset_text=TINY_CSV, dataset_filename="t.csv"
    )


class Watching(Slicer):
    """A slicer noting the latest progress message at each checkpoint; it cancels the
    experiment at the first checkpoint whose message names `stop_in`."""

    def __init__(self, stop_in: str | None = None) -> None:
        super().__init__(None)
        self.latest = ""
        self.at: list[str] = []
        self.stop_in = stop_in

    def progress(self, _fraction: float, message: str) -> None:
        self.latest = message

    def checkpoint(self) -> None:
        self.at.append(self.latest)
        if self.stop_in is not None and self.stop_in in self.latest:
            raise JobCancelled(cancelled_message("a test"))


@pytest.mark.parametrize(
    ("name", "passes"),
    [
        pytest.param(
            "atlas",
            ("function-vector screen", "function vectors, exact", "saliency"),
            marks=pytest.mark.slow,
        ),
        ("towers", ("decomposed",)),
        pytest.param("patching", ("attribution", "exact"), marks=pytest.mark.slow),
    ],
)
def test_every_prompt_of_a_per_prompt_pass_is_a_slice(name: str, passes: tuple[str, ...]) -> None:
    slicer = Watching()
    run_experiment(tiny_llama(), request(name), slicer.progress, batch_size=4, slicer=slicer)
    for label in passes:
        inside = [m for m in slicer.at if f": {label}: " in m]
        assert len(inside) >= N - 1, (label, slicer.at)


@pytest.mark.parametrize(
    ("name", "stage"),
    [
        pytest.param("atlas", "saliency", marks=pytest.mark.slow),
        ("towers", "decomposed"),
        pytest.param("patching", "exact", marks=pytest.mark.slow),
    ],
)
def test_a_cancel_stops_a_per_prompt_pass_at_its_next_prompt(name: str, stage: str) -> None:
    slicer = Watching(stop_in=stage)
    seen: list[str] = []

    def progress(fraction: float, message: str) -> None:
        slicer.progress(fraction, message)
        seen.append(message)

    with pytest.raises(JobCancelled, match="cancelled by a test"):
        run_experiment(tiny_llama(), request(name), progress, batch_size=4, slicer=slicer)
    done = [m for m in seen if f"{stage}: " in m and f"{stage}: 0/" not in m]
    assert not any(f"{stage}: {N}/{N}" in m for m in done), done  # stopped inside the pass
