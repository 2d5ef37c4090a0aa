"""Pydantic request/result contracts shared by the web tier (`app/`) and the model worker.

Nothing here imports torch: results are plain floats, ints and strings. Heads and layers count
from 0; heads are named `L{layer}H{head}` (TransformerLens style).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple, get_args, overload

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)

from model_worker.contracts.caveats import CodedWarning
from model_worker.contracts.caveats import ResultWarning as ResultWarning
from model_worker.contracts.caveats import WarningCode as WarningCode
from model_worker.contracts.evidence import (
    AdequacyOut,
    Design,
    IntervalOut,
    SpreadOut,
    VerdictOut,
)
from model_worker.contracts.figures import FigureData, FigureName, legacy_figures
from model_worker.contracts.report import Block, evidence_blocks, legacy_report
from model_worker.contracts.towers import Towers

#: Bump when the shape or meaning of AnalysisResult changes: it is part of every cache key, so a
#: request is computed afresh; results stored under an older version keep their permalinks
#: (renamed fields are read under their old names too: `_renamed`). 4: `layer_input` split into
#: KeyProjection.normalized_input and HeadDetail.resid_pre. 5: labels read at the first token that
#: tells them apart (a shared prefix appended to the prompt), coded `warnings`, `notes`.
#: 6: experiment figures are data (FigureData), no longer SVG drawn by the engine.
#: 7: a head's label-key tables (`HeadDetail.keys`) are computed on demand: None until asked for
#: (`AnalysisRequest.label_keys`).
#: 8: an experiment's report is data (`ExperimentResult.report`, blocks of plain text), not
#: Markdown (`report_markdown`, read back as blocks).
#: 9: top-token lists are columns (`TopTokens`: ids, tokens, values), not one object a token
#: (read back from the old shape).
RESULT_SCHEMA_VERSION = 9

#: How a head's vector is read through the final norm (model_worker.analysis.projection):
#: the norm's scale frozen at the analysed position (`fixed`, the default and the paper code's),
#: or the real norm of base + v.
NormMode = Literal["fixed", "recompute"]
NORM_MODES: tuple[NormMode, ...] = get_args(NormMode)
#: A model's norm: RMSNorm (`rms`) or LayerNorm (`layer`).
NormKind = Literal["rms", "layer"]
#: What ranks the heads (and picks the detailed top K): the whole head's increase, or the
#: increase of its label positions alone (`label_increase`).
RankBy = Literal["increase", "label"]
#: How the page names each ranking (its menu is built from this; keys are RankBy's values).
RANKINGS: dict[RankBy, str] = {"increase": "increase", "label": "label increase"}


def _fp32_digits(value: float) -> float:
    """7 significant digits: what an fp32 computation carries (float64 reprs print 17)."""
    return float(f"{value:.7g}")


#: A float computed in fp32; JSON keeps the 7 significant digits fp32 can hold.
Fp32 = Annotated[float, PlainSerializer(_fp32_digits, return_type=float, when_used="json")]


#: A head's name, `L{layer}H{head}`: ASCII digits, at most four each (int() of a long digit
#: string is slow, and no model has 10,000 layers).
HEAD_NAME_PATTERN = r"^L([0-9]{1,4})H([0-9]{1,4})$"
_HEAD_NAME = re.compile(HEAD_NAME_PATTERN)


def head_name(layer: int, head: int) -> str:
    """`L{layer}H{head}`, the name a head carries in code, JSON and the UI."""
    return f"L{layer}H{head}"


def parse_head_name(name: str) -> tuple[int, int]:
    """`L3H1` → (3, 1); ValueError with an example for anything else."""
    match = _HEAD_NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"head {name[:40]!r} is not of the form L<layer>H<head>, e.g. L3H1")
    return int(match[1]), int(match[2])


def model_head(name: str, n_layers: int, n_heads: int) -> tuple[int, int]:
    """`parse_head_name`, and ValueError naming the model's size for a head it does not have."""
    layer, head = parse_head_name(name)
    if layer >= n_layers or head >= n_heads:
        raise ValueError(
            f"head {name!r} does not exist: {n_layers} layers × {n_heads} heads "
            f"(L0H0 … L{n_layers - 1}H{n_heads - 1})"
        )
    return layer, head


def _checked_head_name(name: str) -> str:
    parse_head_name(name)
    return name


#: A head name in a request: surrounding whitespace dropped, checked against HEAD_NAME_PATTERN
#: (a malformed one is a validation error, i.e. a 422 at the API).
HeadName = Annotated[
    str,
    StringConstraints(strip_whitespace=True),
    AfterValidator(_checked_head_name),
    WithJsonSchema({"type": "string", "pattern": HEAD_NAME_PATTERN, "examples": ["L3H1"]}),
]


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
    extra_heads: list[HeadName] = Field(default_factory=list, max_length=32)
    #: detailed heads whose score is also decomposed into the two towers (docs/towers.md)
    towers: list[HeadName] = Field(default_factory=list, max_length=4)
    #: the source position they are decomposed at (default: the label each attends to most),
    #: and a second one whose score is subtracted (default: top true − top false label)
    towers_position: int | None = Field(default=None, ge=0)
    towers_versus: int | None = Field(default=None, ge=0)
    #: detailed heads whose label-key tables (`HeadDetail.keys`: every label's normalised
    #: layer input and earlier attention outputs, projected) are computed, "all" for every
    #: detailed head's; the others' are None, computed when a head's tables are opened (an
    #: extra analysis with the head here: they are ~44% of the products at 512 tokens)
    label_keys: Annotated[list[HeadName], Field(max_length=32)] | Literal["all"] = Field(
        default_factory=list
    )
    #: what ranks the heads (`rank` is accepted too: the name requests had before schema 4)
    rank_by: RankBy = Field(default="increase", validation_alias=AliasChoices("rank_by", "rank"))


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
    """A label position: the first token of a demonstration's label; `demonstration` is that
    demonstration's input text (what comes before its separator)."""

    position: int
    token: str
    word: str
    is_true: bool
    demonstration: str = ""


class LayerIncrease(_Frozen):
    layer: int
    attn_increase: Fp32
    ffn_increase: Fp32


class LayerFlow(_Frozen):
    """Information flow in one layer, from its attention averaged over heads (Wang et al.
    2023): the mean weight per (destination, source) pair from each demonstration's tokens into
    its label position, from the label positions into the last one, and of every other causal
    pair; `*_mass` are the summed weights (the three add up to the number of tokens)."""

    layer: int
    demo_to_label: Fp32
    label_to_last: Fp32
    other: Fp32
    demo_to_label_mass: Fp32
    label_to_last_mass: Fp32
    other_mass: Fp32


class HeadSummary(_Frozen):
    """One head: `increase` = I(head | resid_pre); `label_increase` = I of the head restricted
    to the label positions, I(Σ_{p ∈ labels} a_p v_p W_O^h | resid_pre); `other_increase` = I of
    the remaining positions (same I, same norm mode; I is not additive, so the two need not
    sum to `increase`). The split is None in the per-head stage of an analysis ranked by
    `increase`: it comes with the head details."""

    layer: int
    head: int
    name: str
    rank: int
    increase: Fp32
    attn_true: Fp32
    attn_false: Fp32
    label_increase: Fp32 | None = None
    other_increase: Fp32 | None = None

    @property
    def label_share(self) -> float | None:
        """label_increase / increase, for a head with a positive increase (else None): near 1
        for a head whose increase comes from reading the labels, near 0 for one that does not."""
        if self.label_increase is None or self.increase <= 0:
            return None
        return self.label_increase / self.increase


class TopToken(NamedTuple):
    """One top token of a projection: its id, its display text and its value (the logit)."""

    id: int
    token: str
    value: float


_TOP_TOKEN_FIELDS = frozenset(TopToken._fields)


class TopTokens(_Frozen):
    """A projection's top tokens, best first, as three columns of one length (schema 9: ~70,000
    top tokens a 512-token analysis, one object each before). Reads as a sequence of
    `TopToken(id, token, value)` rows: `for t in tops`, `tops[0].token`, `len(tops)`, `tops[:8]`,
    `tops.rows()`; `tops.ids`, `.tokens`, `.values` are the columns. A list of
    `{"id", "token", "value"}` objects (the shape stored before schema 9) or of TopToken rows
    validates to the same columns."""

    ids: list[int]
    tokens: list[str]
    values: list[Fp32]

    @model_validator(mode="before")
    @classmethod
    def _from_rows(cls, data: Any) -> Any:
        if not isinstance(data, list):
            return data
        if not all(
            isinstance(row, TopToken) or (isinstance(row, dict) and row.keys() == _TOP_TOKEN_FIELDS)
            for row in data
        ):
            raise ValueError("top tokens: columns, or a list of {id, token, value} objects")
        rows = [row._asdict() if isinstance(row, TopToken) else row for row in data]
        return {
            "ids": [row["id"] for row in rows],
            "tokens": [row["token"] for row in rows],
            "values": [row["value"] for row in rows],
        }

    @model_validator(mode="after")
    def _one_length(self) -> TopTokens:
        if not len(self.ids) == len(self.tokens) == len(self.values):
            raise ValueError(
                f"top tokens: {len(self.ids)} ids, {len(self.tokens)} tokens and "
                f"{len(self.values)} values (one length)"
            )
        return self

    @classmethod
    def columns(cls, ids: list[int], tokens: list[str], values: list[float]) -> TopTokens:
        """The columns as they are, unvalidated: for the worker, which computed them (plain
        ints, strs and floats of one length; ~7,000 lists a 512-token analysis), never for data
        read from outside, which is validated. What `model_construct` makes, without its pass
        over the fields' defaults (~4× cheaper; validating them is too, their validators
        being Python's)."""
        top = cls.__new__(cls)
        _set = object.__setattr__
        _set(top, "__dict__", {"ids": ids, "tokens": tokens, "values": values})
        _set(top, "__pydantic_fields_set__", {"ids", "tokens", "values"})
        _set(top, "__pydantic_extra__", None)
        _set(top, "__pydantic_private__", None)
        return top

    def rows(self) -> list[TopToken]:
        """The top tokens as (id, token, value) rows, best first."""
        return list(self)

    def __iter__(self) -> Iterator[TopToken]:  # type: ignore[override]
        return map(TopToken, self.ids, self.tokens, self.values)

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> TopToken: ...
    @overload
    def __getitem__(self, index: slice) -> list[TopToken]: ...
    def __getitem__(self, index: int | slice) -> TopToken | list[TopToken]:
        if isinstance(index, slice):
            return self.rows()[index]
        return TopToken(self.ids[index], self.tokens[index], self.values[index])


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
    value: TopTokens
    weighted_value: TopTokens


def _renamed(new: str, old: str) -> Any:
    """Field `new`, read from `old` in a result stored before the schema renamed it (an alias,
    not a model validator: a validator before the model's own would read a stored detail
    through Python objects, ~3× slower than pydantic's JSON parser)."""
    return Field(validation_alias=AliasChoices(new, old))


class KeyProjection(_Frozen):
    """Key side of a label position: its normalised layer input (what the keys are computed
    from, ln(resid_pre)), and the released code's variant (the sum of the earlier layers'
    attention outputs at that position)."""

    position: int
    token: str
    is_true: bool
    normalized_input: TopTokens = _renamed("normalized_input", "layer_input")
    prior_attention: TopTokens


class OffsetQuery(_Frozen):
    """The last-token query as a key at label position `position` sees it under rotary:
    W_K^⊤ R_Δ W_Q x̂ with Δ = `offset` = last position − `position`, projected."""

    position: int
    token: str
    is_true: bool
    offset: int
    query: TopTokens


class HeadDetail(_Frozen):
    """The per-position view of one head. `scores`: the pre-softmax score of the last position
    to every position exactly as the model computes it (softmax over them is `attention`;
    None where the mask excludes a position); `content_scores`: the same with the query and keys
    unrotated; `position_scores`: score − content (None for learned positions: no remainder)."""

    layer: int
    head: int
    name: str
    increase: Fp32
    attention: list[Fp32]
    positions: list[PositionContribution]
    values: list[ValueProjection]
    #: None: not computed (on demand: `AnalysisRequest.label_keys`)
    keys: list[KeyProjection] | None = None
    query: TopTokens
    query_by_offset: list[OffsetQuery] = Field(default_factory=list)
    #: the layer's input residual (resid_pre, before its norm) at the last position
    resid_pre: TopTokens = _renamed("resid_pre", "layer_input")
    value_mrr: list[LabelMrr]
    random_head: str | None
    random_head_mrr: list[LabelMrr]
    scores: list[Fp32 | None] = Field(default_factory=list)
    content_scores: list[Fp32 | None] = Field(default_factory=list)
    position_scores: list[Fp32 | None] | None = None
    #: the score decomposed into the two towers' components (docs/towers.md), when the request
    #: asked for this head (`AnalysisRequest.towers`): at `towers_position` (default: the most
    #: attended label), then that minus `towers_versus` (default: the top true label versus the
    #: top false label, when the prompt has both)
    towers: list[Towers] = Field(default_factory=list)


class AnalysisCore(_Frozen):
    """An analysis without its head details: what pages and panels draw from."""

    schema_version: int = RESULT_SCHEMA_VERSION
    model: str
    n_layers: int
    n_heads: int
    norm: NormMode
    #: what `heads[].rank` and `top_heads` are ranked by
    rank_by: RankBy = "increase"
    prompt: str
    tokens: list[TokenInfo]
    target: Target
    separator: str | None
    labels: list[LabelInfo]
    margin_labels: list[str] | None
    layers: list[LayerIncrease]
    flow: list[LayerFlow] = Field(default_factory=list)
    heads: list[HeadSummary]
    top_heads: list[str]
    #: what the result means, said in words (model_worker.checks): shown above the figures
    warnings: list[CodedWarning] = Field(default_factory=list)
    #: how the prompt was read, e.g. the shared prefix of the labels appended to it
    notes: list[str] = Field(default_factory=list)
    #: The request a worker answered (None from a direct `analyze()` call): it recomputes the
    #: result exactly, e.g. with one more head detailed.
    request: AnalysisRequest | None = None

    def has_head(self, name: str) -> bool:
        """Whether `name` is a well-formed name of one of this model's heads."""
        try:
            model_head(name, self.n_layers, self.n_heads)
        except ValueError:
            return False
        return True

    def head(self, name: str) -> HeadSummary:
        """The summary of head `name` (`L23H1`); KeyError if there is none."""
        for summary in self.heads:
            if summary.name == name:
                return summary
        raise KeyError(name)


class AnalysisResult(AnalysisCore):
    """A whole analysis: the core and the details of the top (and extra) heads."""

    head_details: dict[str, HeadDetail]

    def head(self, name: str) -> Head:
        """Head `name` (`L23H1`): its summary, tied to this analysis; KeyError if there is none."""
        return Head(**dict(super().head(name)), analysis=self)


class Head(HeadSummary):
    """A head's summary with the analysis it belongs to (`.detail`);
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


class ExperimentRequest(_Frozen):
    """One dataset experiment. `dataset` is a built-in name (`sentiment-number`,
    `animal-country`) or `upload`, with the file's text and name carried inline."""

    name: ExperimentName
    dataset: str = Field(min_length=1, max_length=200)
    model: str | None = None
    n: int = Field(default=200, ge=1, le=1000)
    seed: int = 0
    #: experiments that locate in-context heads rank the candidates by this
    locate_by: RankBy = "increase"
    #: MRR and attention experiments: only the prompts the model answers correctly
    correct_only: bool = False
    #: demonstration orders: counterbalanced (every true/false arrangement equally often) or
    #: the paper's FFTT only (true demonstrations nearest the input)
    design: Design = "counterbalanced"
    dataset_text: str | None = Field(default=None, max_length=5 * 1024 * 1024)
    dataset_filename: str | None = Field(default=None, max_length=200)


class ExperimentResult(_Frozen):
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
    #: metric or quantity name → its 95% interval (bootstrap over prompts or exact binomial)
    intervals: dict[str, IntervalOut] = Field(default_factory=dict)
    #: hypotheses decided from the intervals, each with its rule
    verdicts: list[VerdictOut] = Field(default_factory=list)
    #: above chance under counterbalanced order? (None: the experiment does not say)
    adequacy: AdequacyOut | None = None
    #: with several seeds: the seeds, and each metric's spread between them
    seeds: list[int] = Field(default_factory=list)
    seed_spread: dict[str, SpreadOut] = Field(default_factory=dict)
    #: caveats on what the numbers mean (e.g. `small_sample`: fewer than 5 prompts)
    warnings: list[CodedWarning] = Field(default_factory=list)

    def report_blocks(self) -> list[Block]:
        """The report followed by the adequacy gate and the verdict table: what a text of the
        result shows (the CLI, `report.md`); the page draws the verdicts as a view."""
        return [*self.report, *evidence_blocks(self.verdicts, self.adequacy)]
