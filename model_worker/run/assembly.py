"""Result assembly: the analysis' tensors → the result contract's fields (plain floats, top-k
token lists). A head's detail is assembled as plain values and validated once, in one pass (for
its ~700 small objects at 512 tokens that is cheaper than `model_construct` or any Python-level
construction); its top-token lists (`TopTokens`, ~350 a head at 512 tokens) are built from the
columns that came to the host (`PromptRun.tops`), passed as models, not validated again."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from model_worker.analysis.details import HeadViews
from model_worker.analysis.flow import FLOWS, information_flow
from model_worker.analysis.heads import LabelSplit, layer_increase_table
from model_worker.analysis.metrics import mean_reciprocal_rank
from model_worker.analysis.scores import ScoreSplit
from model_worker.contracts.analysis import (
    AnalysisResult,
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
from model_worker.contracts.common import NormMode, RankBy, TopTokens, head_name
from model_worker.run.queries import offset_labels
from model_worker.run.state import PromptRun


def layer_increases(run: PromptRun) -> list[LayerIncrease]:
    """I(attn_l | resid_pre_l) and I(ffn_l | resid_mid_l) for every layer (paper Fig. 2)."""
    c, last = run.cache, run.cache.at(run.last)
    attn, ffn = layer_increase_table(
        projector=run.projector,
        resid_pre=c.resid_pre[:, 0, last],
        attn_out=c.attn_out[:, 0, last],
        mlp_out=c.mlp_out[:, 0, last],
        target=run.target,
        pre_logits=run.pre_logits,
    )
    return [
        LayerIncrease(layer=layer, attn_increase=a, ffn_increase=f)
        for layer, (a, f) in enumerate(zip(attn.tolist(), ffn.tolist(), strict=True))
    ]


def layer_flows(run: PromptRun) -> list[LayerFlow]:
    """Information flow per layer (demonstrations → labels → last token), heads averaged."""
    flow = run.cache.flow  # summed layer by layer during the capture, else from the pattern
    if flow is None:
        flow = information_flow(run.cache.pattern[:, 0], run.label_positions)
    columns = {name: flow.mean[name].tolist() for name in FLOWS}
    columns |= {f"{name}_mass": flow.mass[name].tolist() for name in FLOWS}
    n_layers = run.cache.pattern.shape[0]
    return [
        LayerFlow(layer=layer, **{key: values[layer] for key, values in columns.items()})
        for layer in range(n_layers)
    ]


def label_mrr(run: PromptRun, ranks: Tensor | list[int]) -> list[LabelMrr]:
    """MRR per label token from the ranks [n_labels] of each position's own label."""
    per_label: dict[int, list[int]] = {}
    listed = ranks if isinstance(ranks, list) else ranks.tolist()
    for position, rank in zip(run.label_positions, listed, strict=True):
        per_label.setdefault(run.ids[position], []).append(rank)
    return [
        LabelMrr(label=run.loaded.token_text(label), mrr=mean_reciprocal_rank(r))
        for label, r in per_label.items()
    ]


def head_summaries(
    n_heads: int, order: list[int], columns: dict[str, Tensor], split: LabelSplit | None
) -> list[HeadSummary]:
    """Every head's summary in rank `order` (flat indices layer · n_heads + head), its fields
    from `columns` [L, H] each and `split` (None: the label / other split is not known yet)."""
    if split is not None:
        columns = {**columns, "label_increase": split.label, "other_increase": split.other}
    flat_values = {key: value.flatten().tolist() for key, value in columns.items()}
    return [
        HeadSummary(
            layer=flat // n_heads,
            head=flat % n_heads,
            name=head_name(flat // n_heads, flat % n_heads),
            rank=position + 1,
            **{key: values[flat] for key, values in flat_values.items()},
        )
        for position, flat in enumerate(order)
    ]


def score_fields(split: ScoreSplit | None) -> dict[str, list[float | None] | None]:
    """The HeadDetail score fields of one head (empty without recorded scores)."""
    if split is None:
        return {"scores": [], "content_scores": [], "position_scores": None}
    return {
        "scores": split.values(split.score),
        "content_scores": split.values(split.content),
        "position_scores": None if split.position is None else split.values(split.position),
    }


def target_info(run: PromptRun, logprobs: Tensor, given: bool) -> Target:
    """The analysed target token with its log-probability at the last position."""
    token = run.target
    return Target(
        id=token,
        token=run.loaded.token_text(token),
        logprob=float(logprobs[token]),
        prob=float(logprobs[token].exp()),
        source="given" if given else "predicted",
    )


def heads_stage_result(
    run: PromptRun,
    *,
    norm: NormMode,
    rank_by: RankBy,
    target: Target,
    summaries: list[HeadSummary],
    top: list[tuple[int, int]],
    warnings: list[ResultWarning],
) -> AnalysisResult:
    """The per-head stage's result: tokens, target, labels, layer chart, flow and every head's
    summary; `head_details` empty; the prompt, its labels' demonstrations and the notes on how
    it was read come from the run's one reading of it (`run.read`)."""
    loaded, encoded, g = run.loaded, run.encoded, run.loaded.geometry
    margin = run.margin_ids()
    return AnalysisResult(
        model=loaded.name,
        n_layers=g.n_layers,
        n_heads=g.n_heads,
        norm=norm,
        rank_by=rank_by,
        prompt=run.read.text,
        tokens=[
            TokenInfo(position=p, id=i, text=t)
            for p, (i, t) in enumerate(zip(encoded.ids.tolist(), encoded.texts, strict=True))
        ],
        target=target,
        separator=run.structure.separator,
        labels=[
            LabelInfo(
                position=s.position,
                token=encoded.texts[s.position],
                word=s.word,
                is_true=run.is_true(s.position),
                demonstration=text,
            )
            for s, text in zip(run.structure.labels, run.read.demonstrations, strict=True)
        ],
        margin_labels=None if margin is None else [loaded.token_text(i) for i in margin],
        layers=layer_increases(run),
        flow=layer_flows(run),
        heads=summaries,
        top_heads=[head_name(layer, head) for layer, head in top],
        head_details={},
        warnings=warnings,
        notes=run.read.notes,
    )


#: the prior attention of layer 0 (no earlier layer)
NO_TOKENS = TopTokens.columns([], [], [])


def _positions(
    run: PromptRun, attention: list[float], increase: list[float], margins: list[Any]
) -> list[dict[str, Any]]:
    """A head's per-source-position rows (PositionContribution fields)."""
    texts = run.encoded.texts
    return [
        {
            "position": p,
            "token": texts[p],
            "attention": attention[p],
            "increase": increase[p],
            "margin": margins[p],
        }
        for p in range(run.last + 1)
    ]


def _values(run: PromptRun, views: HeadViews, i: int, ranks: list[int]) -> list[dict[str, Any]]:
    """Head i's label value projections, unweighted and attention-weighted (ValueProjection);
    `ranks`: their label ranks."""
    texts, columns = run.encoded.texts, TopTokens.columns
    ids, tokens, values = run.top_columns(views.value, i)  # per label
    w_ids, w_tokens, w_values = run.top_columns(views.weighted, i)
    return [
        {
            "position": p,
            "token": texts[p],
            "is_true": run.is_true(p),
            "label_rank": ranks[n],
            "value": columns(ids[n], tokens[n], values[n]),
            "weighted_value": columns(w_ids[n], w_tokens[n], w_values[n]),
        }
        for n, p in enumerate(run.label_positions)
    ]


def _keys(run: PromptRun, views: HeadViews, j: int, layer: int) -> list[dict[str, Any]]:
    """The label key views of layer j (KeyProjection): normalised input, prior attention."""
    texts = run.encoded.texts
    return [
        {
            "position": p,
            "token": texts[p],
            "is_true": run.is_true(p),
            "normalized_input": run.tops(views.key, j, n),
            "prior_attention": run.tops(views.prior, j, n) if layer else NO_TOKENS,
        }
        for n, p in enumerate(run.label_positions)
    ]


def _offset_queries(run: PromptRun, views: HeadViews, i: int) -> list[dict[str, Any]]:
    """Head i's rotary-aware query views per label offset (OffsetQuery); none without rotary."""
    if views.offset is None:
        return []
    texts, last = run.encoded.texts, run.last
    return [
        {
            "position": p,
            "token": texts[p],
            "is_true": run.is_true(p),
            "offset": last - p,
            "query": run.tops(views.offset, i, n),
        }
        for n, p in enumerate(offset_labels(run))
    ]


def head_detail(
    run: PromptRun,
    views: HeadViews,
    *,
    i: int,
    j: int,
    key_j: int | None,
    layer: int,
    head: int,
    increase: float,
    attention: list[float],
    per_position: list[float],
    margins: list[float] | None,
    scores: ScoreSplit | None,
    random_head: tuple[str, int] | None,
) -> HeadDetail:
    """The HeadDetail of the i-th detailed head (layer index j among the detailed layers,
    key_j among those whose label keys were projected; None: its `keys` were not computed);
    `attention`, `per_position`, `margins`: its attention, per-position increases and label
    margins (None: no margin) at each position up to the last, as plain floats; `scores`: its
    recorded scores split (`queries.head_scores`, on the host), None without; `random_head`:
    its same-layer random baseline head and that head's index in the baseline views."""
    last = run.last
    no_margins: list[Any] = [None] * (last + 1)
    value_ranks = views.value.rank_lists[i]
    baseline_mrr: list[LabelMrr] = []
    if random_head is not None and views.random is not None:
        baseline_mrr = label_mrr(run, views.random.rank_lists[random_head[1]])
    return HeadDetail.model_validate(
        {
            "layer": layer,
            "head": head,
            "name": head_name(layer, head),
            "increase": increase,
            "attention": attention,
            "positions": _positions(run, attention, per_position, margins or no_margins),
            "values": _values(run, views, i, value_ranks),
            "keys": None if key_j is None else _keys(run, views, key_j, layer),
            "query": run.tops(views.query, i),
            "query_by_offset": _offset_queries(run, views, i),
            "resid_pre": run.tops(views.resid_pre, j),
            "value_mrr": label_mrr(run, value_ranks),
            "random_head": None if random_head is None else random_head[0],
            "random_head_mrr": baseline_mrr,
            **score_fields(scores),
        }
    )
