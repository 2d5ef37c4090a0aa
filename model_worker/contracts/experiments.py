"""Dataset experiments' registry, request and result (torch-free): metrics, tables, figure
data, a report as data, intervals, verdicts and the adequacy gate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from model_worker.contracts.caveats import CodedWarning
from model_worker.contracts.common import Frozen, RankBy
from model_worker.contracts.evidence import (
    AdequacyOut,
    Design,
    IntervalOut,
    LabelStyle,
    SpreadOut,
    VerdictOut,
)
from model_worker.contracts.figures import FigureData, FigureName, legacy_figures
from model_worker.contracts.report import Block, evidence_blocks, legacy_report


@dataclass(frozen=True)
class Experiment:
    """One dataset experiment: the line the page and the CLI show for it, and its runner, a
    module under `model_worker/experiments/` with a `run(ctx: Context) -> ExperimentResult`
    (named here, imported by the worker only, so this registry stays torch-free). Every
    experiment takes the same parameters, ExperimentRequest's fields."""

    description: str
    runner: str


#: Every dataset experiment, in the order the page and the CLI list them: the one registry
#: that the CLI's choices, the API's accepted names, the page's options and the job runner read.
EXPERIMENTS: dict[str, Experiment] = {
    "accuracy": Experiment(
        "ICL accuracy per input class and label assignment (Table 2)", "accuracy"
    ),
    "heads": Experiment(
        "Top-20 heads by mean log-prob increase, overlap between datasets (Fig. 3/4)", "heads"
    ),
    "mrr": Experiment(
        "Label-value MRR, in-context vs random heads of the same layer (Fig. 5)", "mrr"
    ),
    "attention": Experiment(
        "Attention on true vs false labels; attention vs increase (Fig. 6/7)", "attention"
    ),
    "imbalance": Experiment(
        "Imbalanced prompts: attention on true/false labels (Fig. 8/10)", "variants"
    ),
    "reorder": Experiment(
        "Re-ordered prompts: attention on true/false labels (Fig. 9/11)", "variants"
    ),
    "ablation": Experiment("Zero the in-context heads vs as many random heads", "ablation"),
    "bias": Experiment("Majority-label and recency bias reduction (later paper version)", "bias"),
    "flow": Experiment(
        "Information flow per layer: demonstrations → labels → last token (Fig. 1a)", "flow"
    ),
    "layers": Experiment("Attention vs FFN increase per layer over the dataset (Fig. 2)", "layers"),
    "matching": Experiment(
        "Matching test: a demonstration's input as the query; do the heads pick its label?",
        "matching",
    ),
    "towers": Experiment(
        "Why the in-context heads prefer the true label: their scores decomposed (two towers)",
        "towers",
    ),
    "patching": Experiment(
        "Activation patching (denoising swapped labels): heads, and the in-context heads' q/k/v",
        "patching",
    ),
    "atlas": Experiment(
        "Head atlas: in-context, induction, previous-token, function-vector, saliency, sink",
        "atlas",
    ),
}
EXPERIMENT_NAMES: tuple[str, ...] = tuple(EXPERIMENTS)
if TYPE_CHECKING:
    ExperimentName = str
else:  # a Literal built from the registry: pydantic checks it and OpenAPI lists it (an enum)
    ExperimentName = Literal[EXPERIMENT_NAMES]


#: Prompts per prompt set by default: a run in about a minute with the CPU default (SmolLM2 on
#: the embedded server; the atlas, the slowest, took ~2.3 s a prompt on 2 shared cores).
DEFAULT_N = 40
#: Prompts per prompt set for ±5-point intervals (95%) on a proportion near ½:
#: 1.96 · √(¼ / 400) ≈ 0.049; about PRECISE_N / DEFAULT_N times the default's time.
PRECISE_N = 400
#: Most seeds one experiment (or study) runs.
MAX_SEEDS = 20


class ExperimentRequest(Frozen):
    """One dataset experiment. `dataset` is a built-in name (`sentiment-number`,
    `animal-country`) or `upload`, with the file's text and name carried inline."""

    name: ExperimentName
    dataset: str = Field(min_length=1, max_length=200)
    model: str | None = None
    n: int = Field(default=DEFAULT_N, ge=1, le=1000)
    seed: int = 0
    #: several seeds: one run each, pooled into one result (the verdicts decided over every
    #: seed's prompts); empty: `seed` alone. Left out of the request's JSON when empty, so a
    #: one-seed request keeps its job id.
    seeds: list[int] = Field(default_factory=list, max_length=MAX_SEEDS, exclude_if=lambda v: not v)
    #: experiments that locate in-context heads rank the candidates by this
    locate_by: RankBy = "increase"
    #: MRR and attention experiments: only the prompts the model answers correctly
    correct_only: bool = False
    #: demonstration orders: counterbalanced (every true/false arrangement equally often) or
    #: the paper's FFTT only (true demonstrations nearest the input)
    design: Design = "counterbalanced"
    #: demonstrations per label (2: the paper's four demonstrations; 4 or 8: eight or sixteen)
    demos_per_label: int = Field(default=2, ge=1, le=8)
    #: foo/bar (the paper's) or each class's own name as its label
    labels: LabelStyle = "arbitrary"
    dataset_text: str | None = Field(default=None, max_length=5 * 1024 * 1024)
    dataset_filename: str | None = Field(default=None, max_length=200)

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError("each seed once")
        return seeds


class ExperimentResult(Frozen):
    """Headline metrics, tables (rows of plain values, one CSV each), figure data (drawn by the
    views: never markup) and a report as data (`report`: headings, plain-text paragraphs, lists
    and tables that put the measured numbers next to the paper's; the verdicts are `verdicts`).
    Figures stored as SVG by result schema 5 and older are dropped on read; a schema-7 Markdown
    report (`report_markdown`) is read as blocks."""

    _legacy_report = model_validator(mode="before")(legacy_report)

    name: ExperimentName
    model: str
    dataset: str
    n: int
    seed: int
    metrics: dict[str, float]
    tables: dict[str, list[dict[str, float | int | str | None]]]
    figures: Annotated[dict[FigureName, FigureData], BeforeValidator(legacy_figures)]
    #: the report's blocks, plain text (model_worker.contracts.report)
    report: list[Block] = Field(default_factory=list)
    #: the prompt design the numbers come from
    design: Design = "counterbalanced"
    demos_per_label: int = 2
    labels: LabelStyle = "arbitrary"
    #: metric or quantity name → its 95% interval (bootstrap over prompts or exact binomial)
    intervals: dict[str, IntervalOut] = Field(default_factory=dict)
    #: hypotheses decided from the intervals, each with its rule
    verdicts: list[VerdictOut] = Field(default_factory=list)
    #: above chance under counterbalanced order? (None: the experiment does not say)
    adequacy: AdequacyOut | None = None
    #: with several seeds: the seeds, and each metric's spread between them
    seeds: list[int] = Field(default_factory=list)
    seed_spread: dict[str, SpreadOut] = Field(default_factory=dict)
    #: with several seeds: what stays the first seed's alone, not pooled over every seed's
    #: prompts (`metrics.NAME`, `tables.NAME`, `figures`, `report`); the rest is pooled
    #: (results combined before this was recorded: empty, and everything but the verdicts,
    #: intervals and gate is the first seed's)
    first_seed_only: list[str] = Field(default_factory=list)
    #: caveats on what the numbers mean (e.g. `small_sample`: fewer than 5 prompts)
    warnings: list[CodedWarning] = Field(default_factory=list)

    def report_blocks(self) -> list[Block]:
        """The report followed by the adequacy gate and the verdict table: what a text of the
        result shows (the CLI, `report.md`); the page draws the verdicts as a view."""
        return [*self.report, *evidence_blocks(self.verdicts, self.adequacy)]
