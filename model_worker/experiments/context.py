"""What every experiment runner receives, and how it wraps up its ExperimentResult."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from model_worker.contracts.experiments import ExperimentRequest, ExperimentResult
from model_worker.contracts.figures import FigureData
from model_worker.contracts.report import blocks_of
from model_worker.datasets import Dataset, IclPrompt, Variant
from model_worker.experiments.batching import Extra, Prepared, PromptRun, prepare, run_prompts
from model_worker.experiments.data import PromptOptions, prompts
from model_worker.experiments.evidence import Evidence, contract_fields
from model_worker.experiments.progress import ProgressFn
from model_worker.experiments.stats import Interval
from model_worker.model.loading import LoadedModel

Row = dict[str, float | int | str | None]


@dataclass(frozen=True)
class Context:
    """An experiment request resolved: the model, the dataset, the batch size, progress, and
    the longest prompt allowed (`max_tokens`). `kept` collects the run's intervals with what
    they were computed from (for pooling seeds: model_worker.experiments.seeds)."""

    loaded: LoadedModel
    request: ExperimentRequest
    dataset: Dataset
    batch_size: int
    progress: ProgressFn
    max_tokens: int
    kept: dict[str, Interval] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.request.n

    @property
    def seed(self) -> int:
        return self.request.seed

    def prompts(
        self, variant: Variant = "balanced", *, foo_class: str | None = None
    ) -> list[IclPrompt]:
        """The request's `n` prompts of its seed and design (`variant`: e.g. imbalanced)."""
        return prompts(
            self.dataset,
            self.n,
            self.seed,
            variant=variant,
            foo_class=foo_class,
            **self.prompt_options,
        )

    @property
    def prompt_options(self) -> PromptOptions:
        """The request's prompt design: demonstration order, count and labels."""
        return {
            "design": self.request.design,
            "demos_per_label": self.request.demos_per_label,
            "labels": self.request.labels,
        }

    def prepare(self, icl_prompts: Sequence[IclPrompt]) -> list[Prepared]:
        """`icl_prompts` tokenized within the prompt limit, their label positions found."""
        return prepare(self.loaded, icl_prompts, self.max_tokens)

    def run_dataset(self, extra: Extra, progress: ProgressFn, label: str) -> list[PromptRun]:
        """The dataset's `n` balanced prompts of the request's seed, run in batches, with
        `extra(batch, cache)` read from each batch's forward pass."""
        items = self.prepare(self.prompts())
        return run_prompts(
            self.loaded,
            items,
            batch_size=self.batch_size,
            extra=extra,
            progress=progress,
            label=label,
        )

    def result(
        self,
        metrics: dict[str, float],
        tables: dict[str, list[Row]],
        figures: dict[str, FigureData],
        report: str,
        evidence: Evidence | None = None,
    ) -> ExperimentResult:
        """The result; with `evidence`, its intervals, verdicts and adequacy gate (data of
        their own: the report's text does not repeat them). `report`, the runner's text with
        a little Markdown, becomes blocks of plain text (model_worker.contracts.report)."""
        found = Evidence() if evidence is None else evidence
        self.kept.update(found.kept())
        return ExperimentResult(
            name=self.request.name,
            model=self.loaded.name,
            dataset=self.dataset.name,
            n=self.n,
            seed=self.seed,
            metrics={k: float(v) for k, v in metrics.items()},
            tables=tables,
            figures=figures,
            report=blocks_of(report),
            design=self.request.design,
            demos_per_label=self.request.demos_per_label,
            labels=self.request.labels,
            **contract_fields(found),
        )
