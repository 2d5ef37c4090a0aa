"""An analysis' request and result (torch-free): tokens, target, labels, layer and head
increases, flow, and the per-position details of the detailed heads. Heads and layers count
from 0; heads are named `L{layer}H{head}` (TransformerLens style)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field

from model_worker.contracts.caveats import CodedWarning
from model_worker.contracts.common import (
    RESULT_SCHEMA_VERSION,
    Fp32,
    Frozen,
    HeadName,
    NormMode,
    RankBy,
    TopTokens,
    model_head,
)
from model_worker.contracts.towers import Towers


class AnalysisRequest(Frozen):
    """What a client asks for; the worker fills in defaults it owns (model, limits)."""

    prompt: str = Field(min_length=1, max_length=100_000)
    model: str | None = None
    target: str | None = Field(default=None, max_length=200)
    labels: list[str] | None = Field(default=None, max_length=64)
    #: the right answer to the prompt's query, when the caller knows it: the result says
    #: whether the model's prediction is it (`AnalysisCore.answer`); it changes nothing else
    expected: str | None = Field(default=None, max_length=200, pattern=r"\S")
    norm: NormMode = "fixed"
    top_k_heads: int = Field(default=20, ge=1, le=200)
    top_k_tokens: int = Field(default=10, ge=1, le=50)
    extra_heads: list[HeadName] = Field(default_factory=list, max_length=32)
    #: detailed heads whose score is also decomposed into the two towers (docs/towers.md)
    towers: list[HeadName] = Field(default_factory=list, max_length=4)
    #: the source position they are decomposed at (default: the label each attends to most),
    #: and a second one whose score is subtracted (default: top true − top false label)
    #: token positions: fewer than the prompt's characters (the checks compare them with its
    #: tokens once it is read)
    towers_position: int | None = Field(default=None, ge=0, lt=100_000)
    towers_versus: int | None = Field(default=None, ge=0, lt=100_000)
    #: detailed heads whose label-key tables (`HeadDetail.keys`: every label's normalised
    #: layer input and earlier attention outputs, projected) are computed, "all" for every
    #: detailed head's; the others' are None, computed when a head's tables are opened (an
    #: extra analysis with the head here: they are ~44% of the products at 512 tokens)
    label_keys: Annotated[list[HeadName], Field(max_length=32)] | Literal["all"] = Field(
        default_factory=list
    )
    #: what ranks the heads (`rank` is accepted too: the name requests had before schema 4)
    rank_by: RankBy = Field(default="increase", validation_alias=AliasChoices("rank_by", "rank"))


class TokenInfo(Frozen):
    position: int
    id: int
    text: str


class Target(Frozen):
    id: int
    token: str
    logprob: Fp32
    prob: Fp32
    source: Literal["predicted", "given"]


class AnswerCheck(Frozen):
    """Is the model's prediction right? `predicted_token` is the vocabulary argmax at the last
    position; `expected_token` the first token of the right answer `expected` as it would
    follow the prompt. `source`: the request gave the answer ("given"), or the query repeats a
    demonstration's input, whose label is then the answer ("demonstrated"). Absent where the
    answer is not known: an arbitrary prompt has none."""

    expected: str
    expected_token: str
    predicted_token: str
    correct: bool
    #: probability of the expected token at the last position
    expected_prob: Fp32
    source: Literal["given", "demonstrated"]


class LabelInfo(Frozen):
    """A label position: the first token of a demonstration's label; `demonstration` is that
    demonstration's input text (what comes before its separator)."""

    position: int
    token: str
    word: str
    is_true: bool
    demonstration: str = ""


class LayerIncrease(Frozen):
    layer: int
    attn_increase: Fp32
    ffn_increase: Fp32


class LayerFlow(Frozen):
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


class HeadSummary(Frozen):
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


class PositionContribution(Frozen):
    """One subheadvalue a_p · v_p · W_O^h of a head, at source position p."""

    position: int
    token: str
    attention: Fp32
    increase: Fp32
    margin: Fp32 | None = None


class LabelMrr(Frozen):
    label: str
    mrr: Fp32


class ValueProjection(Frozen):
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


class KeyProjection(Frozen):
    """Key side of a label position: its normalised layer input (what the keys are computed
    from, ln(resid_pre)), and the released code's variant (the sum of the earlier layers'
    attention outputs at that position)."""

    position: int
    token: str
    is_true: bool
    normalized_input: TopTokens = _renamed("normalized_input", "layer_input")
    prior_attention: TopTokens


class OffsetQuery(Frozen):
    """The last-token query as a key at label position `position` sees it under rotary:
    W_K^⊤ R_Δ W_Q x̂ with Δ = `offset` = last position − `position`, projected."""

    position: int
    token: str
    is_true: bool
    offset: int
    query: TopTokens


class HeadDetail(Frozen):
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


class AnalysisCore(Frozen):
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
    #: is the prediction the right answer? None where the answer is not known
    answer: AnswerCheck | None = None
    separator: str | None
    labels: list[LabelInfo]
    margin_labels: list[str] | None
    layers: list[LayerIncrease]
    flow: list[LayerFlow] = Field(default_factory=list)
    heads: list[HeadSummary]
    top_heads: list[str]
    #: what the result means, said in words (model_worker.checks.result_warnings): shown above the
    #: figures
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
