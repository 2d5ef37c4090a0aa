"""Pydantic request/result contracts shared by the web tier (`app/`) and the model worker.

Nothing here imports torch: results are plain floats, ints and strings. Heads and layers count
from 0; heads are named `L{layer}H{head}` (TransformerLens style).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer

from app.display import AnalysisDisplay, ExperimentDisplay, HeadDisplay

#: Bump when the shape or meaning of AnalysisResult changes: it is part of every cache key.
RESULT_SCHEMA_VERSION = 2

NormMode = Literal["fixed", "recompute"]


def _fp32_digits(value: float) -> float:
    """7 significant digits: what an fp32 computation carries (float64 reprs print 17)."""
    return float(f"{value:.7g}")


#: A float computed in fp32; JSON keeps the 7 significant digits fp32 can hold.
Fp32 = Annotated[float, PlainSerializer(_fp32_digits, return_type=float, when_used="json")]


def head_name(layer: int, head: int) -> str:
    """`L{layer}H{head}`, the name a head carries in code, JSON and the UI."""
    return f"L{layer}H{head}"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AnalysisRequest(_Frozen):
    """What a client asks for; the worker fills in defaults it owns (model, limits)."""

    prompt: str = Field(min_length=1, max_length=100_000)
    model: str | None = None
    target: str | None = Field(default=None, max_length=200)
    labels: list[str] | None = Field(default=None, max_length=64)
    norm: NormMode = "fixed"
    top_k_heads: int = Field(default=20, ge=1, le=200)
    top_k_tokens: int = Field(default=10, ge=1, le=50)
    extra_heads: list[str] = Field(default_factory=list, max_length=32)


class TokenInfo(_Frozen):
    position: int
    id: int
    text: str


class Target(_Frozen):
    id: int
    token: str
    logprob: Fp32
    prob: Fp32
    source: Literal["predicted", "given"]


class LabelInfo(_Frozen):
    """A label position: the first token of a demonstration's label."""

    position: int
    token: str
    word: str
    is_true: bool


class LayerIncrease(_Frozen):
    layer: int
    attn_increase: Fp32
    ffn_increase: Fp32


class HeadSummary(_Frozen):
    layer: int
    head: int
    name: str
    rank: int
    increase: Fp32
    attn_true: Fp32
    attn_false: Fp32


class TopToken(_Frozen):
    id: int
    token: str
    value: Fp32


class PositionContribution(_Frozen):
    """One subheadvalue a_p · v_p · W_O^h of a head, at source position p."""

    position: int
    token: str
    attention: Fp32
    increase: Fp32
    margin: Fp32 | None = None


class LabelMrr(_Frozen):
    label: str
    mrr: Fp32


class ValueProjection(_Frozen):
    """Top tokens of a label position's value v_p W_O^h, unweighted and attention-weighted."""

    position: int
    token: str
    is_true: bool
    label_rank: int
    value: list[TopToken]
    weighted_value: list[TopToken]


class KeyProjection(_Frozen):
    """Key side of a label position: the normed layer input, and the released code's variant
    (the sum of the earlier layers' attention outputs at that position)."""

    position: int
    token: str
    is_true: bool
    layer_input: list[TopToken]
    prior_attention: list[TopToken]


class HeadDetail(_Frozen):
    layer: int
    head: int
    name: str
    increase: Fp32
    attention: list[Fp32]
    positions: list[PositionContribution]
    values: list[ValueProjection]
    keys: list[KeyProjection]
    query: list[TopToken]
    layer_input: list[TopToken]
    value_mrr: list[LabelMrr]
    random_head: str | None
    random_head_mrr: list[LabelMrr]


class AnalysisCore(_Frozen):
    """An analysis without its head details: what pages and panels draw from."""

    schema_version: int = RESULT_SCHEMA_VERSION
    model: str
    n_layers: int
    n_heads: int
    norm: NormMode
    prompt: str
    tokens: list[TokenInfo]
    target: Target
    separator: str | None
    labels: list[LabelInfo]
    margin_labels: list[str] | None
    layers: list[LayerIncrease]
    heads: list[HeadSummary]
    top_heads: list[str]
    warnings: list[str] = Field(default_factory=list)
    #: The request a worker answered (None from a direct `analyze()` call): it recomputes the
    #: result exactly, e.g. with one more head detailed.
    request: AnalysisRequest | None = None

    def head(self, name: str) -> HeadSummary:
        """The summary of head `name` (`L23H1`); KeyError if there is none."""
        for summary in self.heads:
            if summary.name == name:
                return summary
        raise KeyError(name)


class AnalysisResult(AnalysisDisplay, AnalysisCore):
    """A whole analysis: the core and the details of the top (and extra) heads."""

    head_details: dict[str, HeadDetail]

    def head(self, name: str) -> Head:
        """Head `name` (`L23H1`): its summary, tied to this analysis; KeyError if there is none."""
        return Head(**dict(super().head(name)), analysis=self)


class Head(HeadDisplay, HeadSummary):
    """A head's summary with the analysis it belongs to (`.detail`, its notebook view);
    `model_dump()` gives the summary alone."""

    analysis: AnalysisResult = Field(exclude=True, repr=False)

    @property
    def detail(self) -> HeadDetail | None:
        """Its per-position detail, or None when the analysis did not detail it."""
        return self.analysis.head_details.get(self.name)


class AnalysisSummary(AnalysisCore):
    """The core and, per detailed head, its label-value MRR: what the page, the status poll and
    the panels read, without parsing the (possibly large) head details."""

    detail_mrr: dict[str, list[LabelMrr]]


ExperimentName = Literal[
    "accuracy", "heads", "mrr", "attention", "imbalance", "reorder", "ablation", "bias"
]
EXPERIMENT_NAMES: tuple[str, ...] = (
    "accuracy",
    "heads",
    "mrr",
    "attention",
    "imbalance",
    "reorder",
    "ablation",
    "bias",
)


class ExperimentRequest(_Frozen):
    """One dataset experiment. `dataset` is a built-in name (`sentiment-number`,
    `animal-country`) or `upload`, with the file's text and name carried inline."""

    name: ExperimentName
    dataset: str = Field(min_length=1, max_length=200)
    model: str | None = None
    n: int = Field(default=200, ge=1, le=1000)
    seed: int = 0
    dataset_text: str | None = Field(default=None, max_length=5 * 1024 * 1024)
    dataset_filename: str | None = Field(default=None, max_length=200)


class ExperimentResult(ExperimentDisplay, _Frozen):
    """Headline metrics, tables (rows of plain values, one CSV each), SVG figures and a
    Markdown report that puts the measured numbers next to the paper's."""

    name: ExperimentName
    model: str
    dataset: str
    n: int
    seed: int
    metrics: dict[str, float]
    tables: dict[str, list[dict[str, float | int | str | None]]]
    figures: dict[str, str]
    report_markdown: str
