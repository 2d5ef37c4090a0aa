"""A study: several experiments × datasets × seeds as one submission (torch-free).

`StudyRequest` is what `POST /api/studies` and `icl-heads study` take; `experiment_requests`
plans its experiment jobs, one per experiment and dataset, each running every seed and pooling
them (`ExperimentRequest.seeds`). Datasets are built-in ones (the web tier checks the names).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from model_worker.contracts.common import Frozen, RankBy
from model_worker.contracts.evidence import Design, LabelStyle
from model_worker.contracts.experiments import (
    DEFAULT_N,
    MAX_SEEDS,
    ExperimentName,
    ExperimentRequest,
)

#: The paper study: every experiment of the results document, in its order.
PAPER_EXPERIMENTS: tuple[str, ...] = (
    "accuracy",
    "heads",
    "mrr",
    "attention",
    "layers",
    "flow",
    "matching",
    "imbalance",
    "reorder",
    "ablation",
    "bias",
)
#: Most datasets one study covers.
MAX_DATASETS = 4


def _distinct(what: str, values: list[str] | list[int]) -> None:
    if len(set(values)) != len(values):
        raise ValueError(f"each {what} once")


class StudyRequest(Frozen):
    """Experiments × datasets × seeds on one model, with one prompt design."""

    model: str | None = None
    experiments: list[ExperimentName] = Field(
        default_factory=lambda: list(PAPER_EXPERIMENTS), min_length=1
    )
    datasets: list[str] = Field(
        default_factory=lambda: ["sentiment-number"], min_length=1, max_length=MAX_DATASETS
    )
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, max_length=MAX_SEEDS)
    n: int = Field(default=DEFAULT_N, ge=1, le=1000)
    locate_by: RankBy = "increase"
    correct_only: bool = False
    design: Design = "counterbalanced"
    demos_per_label: int = Field(default=2, ge=1, le=8)
    labels: LabelStyle = "arbitrary"

    @field_validator("experiments", "datasets", "seeds")
    @classmethod
    def _once_each(cls, values: list[str] | list[int]) -> list[str] | list[int]:
        _distinct("name" if values and isinstance(values[0], str) else "seed", values)
        return values

    def experiment_requests(self) -> list[ExperimentRequest]:
        """The study's experiment jobs: experiment by experiment, each on every dataset, every
        seed in each (pooled: one seed alone is `seed`)."""
        seeds = {"seed": self.seeds[0], "seeds": self.seeds if len(self.seeds) > 1 else []}
        design = self.model_dump(
            include={"model", "n", "locate_by", "correct_only", "design", "demos_per_label"}
            | {"labels"}
        )
        return [
            ExperimentRequest(name=name, dataset=dataset, **design, **seeds)
            for name in self.experiments
            for dataset in self.datasets
        ]
