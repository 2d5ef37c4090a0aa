"""One data model per dashboard panel: its fields are the panel's JSON twin (`response_model`)
and the model itself is what the panel's template renders from (the pages, the HTMX partials
and the notebook views alike). Each model also keeps, privately, the analysis it was cut from
(its figures draw from it) and the job id its links point to (empty: no links)."""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal, Self

from pydantic import BaseModel, PrivateAttr

from app.views.compare_checks import comparison_warnings, shared_domain
from app.views.figure_kit.figure import Figure, Row
from app.views.figure_kit.text import shown_tokens
from app.views.figures.analysis import (
    attention_figure,
    comparable,
    diff_figure,
    flow_figure,
    heatmap_figure,
    increase_figure,
    layers_figure,
    margin_figure,
    ranked_demonstrations,
    scores_figure,
)
from app.views.figures.experiments import experiment_figure
from app.views.figures.towers import towers_figures
from model_worker.contracts.analysis import (
    AnalysisCore,
    AnalysisResult,
    AnalysisSummary,
    AnswerCheck,
    HeadDetail,
    HeadSummary,
    LabelInfo,
    LabelMrr,
    LayerFlow,
    LayerIncrease,
    Target,
    TokenInfo,
)
from model_worker.contracts.caveats import ResultWarning
from model_worker.contracts.experiments import ExperimentResult
from model_worker.service.queue.result_parts import detail_mrr
from model_worker.service.queue.states import JobState, JobStatus

Analysis = AnalysisSummary | AnalysisResult


class _Linked(BaseModel):
    """A view's data and, privately, the analysis its links point to."""

    _job_id: str = PrivateAttr(default="")

    @property
    def job_id(self) -> str:
        """The page's analysis, for links ("" in the notebook: no links)."""
        return self._job_id


class Panel(_Linked):
    """A panel's data; `of()` cuts it from an analysis."""

    _result: AnalysisCore = PrivateAttr()
    _link: bool = PrivateAttr(default=True)

    @classmethod
    def of(cls, result: Analysis, job_id: str = "", link: bool = True) -> Self:
        """The panel of `result` (of analysis `job_id`; `link`: clickable cells)."""
        panel = cls.model_validate(cls.fields_of(result))
        panel._result, panel._job_id, panel._link = result, job_id, link
        return panel

    @classmethod
    def fields_of(cls, result: Analysis) -> dict[str, Any]:
        """The panel's fields, read from `result` (by default its fields of the same names)."""
        return {name: getattr(result, name) for name in cls.model_fields}

    @property
    def result(self) -> AnalysisCore:
        """The analysis the panel was cut from."""
        return self._result


class TokensPanel(Panel):
    """The prompt's tokens with its labels marked, and the target."""

    tokens: list[TokenInfo]
    labels: list[LabelInfo]
    target: Target
    answer: AnswerCheck | None = None
    separator: str | None
    warnings: list[ResultWarning]

    @property
    def kinds(self) -> dict[int, str]:
        """Label positions: "true" or "false"."""
        return {label.position: "true" if label.is_true else "false" for label in self.labels}

    @property
    def last(self) -> int:
        """The analysed (last) position."""
        return len(self.tokens) - 1

    @cached_property
    def shown(self) -> list[str]:
        """Each token as the strip shows it: a character's byte-level pieces as that
        character, numbered; whitespace visible (figure_kit.text.shown_tokens)."""
        return shown_tokens([t.text for t in self.tokens])


class LayersPanel(Panel):
    """Attention vs FFN increase per layer."""

    layers: list[LayerIncrease]

    @cached_property
    def figure(self) -> Figure:
        return layers_figure(self.result)


class FlowPanel(Panel):
    """Information flow per layer: demonstrations → labels → last token."""

    flow: list[LayerFlow]

    @cached_property
    def figure(self) -> Figure:
        return flow_figure(self.result)


class HeatmapPanel(Panel):
    """Every head's summary, drawn as a layer × head heatmap."""

    n_layers: int
    n_heads: int
    heads: list[HeadSummary]

    @cached_property
    def figure(self) -> Figure:
        return heatmap_figure(self.result, clickable=self._link)

    @property
    def link(self) -> bool:
        """Whether a click on a cell opens that head's panel."""
        return self._link


class TopHead(HeadSummary):
    """A top head's summary with its label-value MRR (when the analysis detailed it)."""

    value_mrr: list[LabelMrr]

    def mrr_of(self, label: str) -> float | None:
        """The MRR of `label` (None if the head has none for it)."""
        return next((m.mrr for m in self.value_mrr if m.label == label), None)


class TopHeadsPanel(Panel):
    """The top heads in rank order."""

    top_heads: list[TopHead]

    @classmethod
    def fields_of(cls, result: Analysis) -> dict[str, Any]:
        mrr = detail_mrr(result)
        fields = HeadSummary.model_fields
        summaries = {summary.name: summary for summary in result.heads}  # summaries only
        return {
            "top_heads": [
                {
                    **{key: getattr(summaries[name], key) for key in fields},
                    "value_mrr": mrr.get(name, []),
                }
                for name in result.top_heads
            ]
        }

    @property
    def mrr_labels(self) -> list[str]:
        """The labels some head has an MRR for, in order of appearance (the MRR columns)."""
        return list(dict.fromkeys(m.label for h in self.top_heads for m in h.value_mrr))


class AnalysisView(BaseModel):
    """The analysis body: its panels (the page renders them together)."""

    tokens: TokensPanel
    layers: LayersPanel
    flow: FlowPanel
    heatmap: HeatmapPanel
    top_heads: TopHeadsPanel

    @classmethod
    def of(cls, result: Analysis, job_id: str = "", link: bool = True) -> AnalysisView:
        """All panels of `result` (of analysis `job_id`; `link`: clickable cells)."""
        return cls(
            tokens=TokensPanel.of(result, job_id, link),
            layers=LayersPanel.of(result, job_id, link),
            flow=FlowPanel.of(result, job_id, link),
            heatmap=HeatmapPanel.of(result, job_id, link),
            top_heads=TopHeadsPanel.of(result, job_id, link),
        )

    @property
    def result(self) -> AnalysisCore:
        return self.tokens.result

    @property
    def job_id(self) -> str:
        return self.tokens.job_id


#: The analysis panels with an HTML partial and a JSON twin, by their URL name.
ANALYSIS_PANELS: dict[str, type[Panel]] = {
    "tokens": TokensPanel,
    "layers": LayersPanel,
    "flow": FlowPanel,
    "heatmap": HeatmapPanel,
    "top-heads": TopHeadsPanel,
}


class HeadPanel(_Linked):
    """A head's panel: its summary and detail (`job`: the analysis holding the detail)."""

    status: Literal["done"] = "done"
    job: str
    summary: HeadSummary
    detail: HeadDetail
    _result: AnalysisCore = PrivateAttr()

    @classmethod
    def of(
        cls, result: AnalysisCore, detail: HeadDetail, job_id: str = "", source_id: str = ""
    ) -> HeadPanel:
        """Head `detail.name` of `result` (analysis `job_id`; its detail from `source_id`)."""
        summary = AnalysisCore.head(result, detail.name)  # the summary alone, computing nothing
        panel = cls(job=source_id, summary=summary, detail=detail)
        panel._result, panel._job_id = result, job_id
        return panel

    @property
    def source_id(self) -> str:
        """The analysis holding the detail (the figures' downloads come from it)."""
        return self.job

    @cached_property
    def figures(self) -> list[Figure]:
        """Attention, QK scores, increase and margin (those the analysis has)."""
        result, detail = self._result, self.detail
        built = [
            attention_figure(result, detail),
            scores_figure(result, detail),
            increase_figure(result, detail),
            margin_figure(result, detail),
        ]
        return [f for f in built if f is not None]

    @cached_property
    def demonstrations(self) -> list[Row]:
        return ranked_demonstrations(self._result, self.detail)

    @cached_property
    def towers(self) -> dict[str, list[Figure]]:
        """The score decomposition's figures (docs/towers.md): `attended` (the most attended
        label) and `versus` (top true label − top false label); empty when not computed."""
        return {
            view: towers_figures(self._result, self.detail, versus)
            for view, versus in (("attended", False), ("versus", True))
        }


class HeadPending(_Linked):
    """A head outside the stored details while the analysis `job` computes it (or why it
    could not)."""

    status: JobStatus
    job: str
    error: str | None
    _name: str = PrivateAttr(default="")

    @classmethod
    def of(cls, state: JobState, job_id: str, name: str) -> HeadPending:
        """Head `name` of analysis `job_id`, being computed by the job `state`."""
        pending = cls(status=state.status, job=state.id, error=state.error)
        pending._job_id, pending._name = job_id, name
        return pending

    @property
    def name(self) -> str:
        """The head being computed."""
        return self._name


class HeadOffer(_Linked):
    """A head (or its score decomposition, or its label-key tables) that is not computed: a
    GET computes nothing, the same URL POSTed does (an extra analysis of the head). `stored`
    is the head's detail as the analysis has it (None: outside its stored details)."""

    status: Literal["not computed"] = "not computed"
    name: str
    detail: str = "not computed: POST the same URL to compute it"
    _stored: HeadPanel | None = PrivateAttr(default=None)

    @classmethod
    def of(
        cls, result: AnalysisCore, stored: HeadDetail | None, job_id: str, name: str
    ) -> HeadOffer:
        """Head `name` of `result` (analysis `job_id`), stored as `stored`."""
        offer = cls(name=name)
        offer._job_id = job_id
        offer._stored = None if stored is None else HeadPanel.of(result, stored, job_id, job_id)
        return offer

    @property
    def stored(self) -> HeadPanel | None:
        """The head's panel as stored (what exists), if the analysis details it."""
        return self._stored


class HeadDifference(BaseModel):
    """One head's increase in analyses A and B and the difference B − A."""

    layer: int
    head: int
    name: str
    increase_a: float
    increase_b: float
    difference: float


class Comparison(BaseModel):
    """Two analyses, head by head: the compare view's data and its JSON twin (`heads` is empty
    when their shapes differ; `problem` says why)."""

    a: str
    b: str
    heads: list[HeadDifference]
    #: how A and B differ beyond their prompts (target, model, labels, norm, ranking)
    warnings: list[str] = []
    _left: AnalysisView = PrivateAttr()
    _right: AnalysisView = PrivateAttr()
    _figure: Figure | None = PrivateAttr(default=None)
    _problem: str | None = PrivateAttr(default=None)
    _heatmaps: dict[str, Figure] = PrivateAttr(default_factory=dict)

    @classmethod
    def of(cls, a: str, result_a: Analysis, b: str, result_b: Analysis) -> Comparison:
        """Analyses `a` and `b` compared (B − A), each with its panels (cells not clickable)."""
        problem = comparable(result_a, result_b)
        figure = None if problem else diff_figure(result_a, result_b)
        comparison = cls(
            a=a,
            b=b,
            heads=[] if figure is None else figure.rows,
            warnings=comparison_warnings(result_a, result_b),
        )
        comparison._left = AnalysisView.of(result_a, a, link=False)
        comparison._right = AnalysisView.of(result_b, b, link=False)
        domain = shared_domain(result_a, result_b)
        comparison._heatmaps = {
            side: heatmap_figure(result, domain=domain)
            for side, result in (("A", result_a), ("B", result_b))
        }
        comparison._figure, comparison._problem = figure, problem
        return comparison

    @property
    def heatmaps(self) -> dict[str, Figure]:
        """A's and B's heatmaps ("A", "B") on one colour scale (`shared_domain`)."""
        return self._heatmaps

    @property
    def sides(self) -> list[tuple[str, AnalysisView]]:
        """("A", its panels) and ("B", its panels)."""
        return [("A", self._left), ("B", self._right)]

    @property
    def figure(self) -> Figure | None:
        """The difference heatmap (None when the analyses cannot be compared)."""
        return self._figure

    @property
    def problem(self) -> str | None:
        """Why the analyses cannot be compared head by head (None if they can)."""
        return self._problem


class ExperimentPanel(ExperimentResult):
    """A done experiment as its view draws it: the result (its JSON twin; its report's blocks
    and verdicts drawn by the templates, every string escaped); links point to job `job_id`
    (empty: no links)."""

    _job_id: str = PrivateAttr(default="")

    @classmethod
    def of(cls, result: ExperimentResult, job_id: str = "") -> ExperimentPanel:
        """The panel of `result` (of experiment `job_id`)."""
        panel = cls(**dict(result))
        panel._job_id = job_id
        return panel

    @property
    def job_id(self) -> str:
        return self._job_id

    @cached_property
    def drawn(self) -> list[Figure]:
        """The experiment's figures, drawn from their data."""
        return [experiment_figure(name, data) for name, data in self.figures.items()]
