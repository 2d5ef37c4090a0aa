"""`analyze()`: locate-and-project on one prompt → an AnalysisResult (plain floats, top-k lists).

The orchestrator: it captures the prompt, reads what the analysis needs from the model (weights,
real queries, recorded scores), hands tensors to the pure stages in `model_worker.analysis`
(`heads`: the per-head stage; `details`: the detailed heads) and assembles the result contract.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any

import torch
from torch import Tensor

from model_worker.analysis.baseline import random_heads
from model_worker.analysis.details import head_values, head_views
from model_worker.analysis.flow import FLOWS, information_flow
from model_worker.analysis.head_unembedding import FactoredValues, head_unembedding
from model_worker.analysis.heads import (
    LabelSplit,
    attention_sums,
    head_increases,
    head_writes,
    label_split,
    layer_increase_table,
)
from model_worker.analysis.icl import IclStructure, demonstration_texts, detect_structure
from model_worker.analysis.metrics import VocabSummary, mean_reciprocal_rank
from model_worker.analysis.projection import FinalNorm, VocabProjector
from model_worker.analysis.scores import (
    ScoreSplit,
    Unrotate,
    rotary_offset_queries,
    score_split,
)
from model_worker.architectures import HeadGeometry
from model_worker.capture import RunCache, run_with_cache
from model_worker.contracts import (
    AnalysisResult,
    HeadDetail,
    HeadSummary,
    LabelInfo,
    LabelMrr,
    LayerFlow,
    LayerIncrease,
    NormMode,
    RankBy,
    Target,
    TokenInfo,
    head_name,
)
from model_worker.defaults import DEFAULT_MAX_PROMPT_TOKENS
from model_worker.head_unembeddings import HeadUnembeddings
from model_worker.loading import LoadedModel
from model_worker.prompting import Encoded, encode_prompt, parse_head_names, target_id
from model_worker.qk import LayerQk, rotate


def final_projector(loaded: LoadedModel, x_final: Tensor, mode: NormMode) -> VocabProjector:
    """The VocabProjector of `loaded` at the analysed position's final residual `x_final` [D]."""
    adapter, device = loaded.adapter, x_final.device
    norm = adapter.final_norm(loaded.model)
    w_u, b_u = loaded.unembedding()
    return VocabProjector.at(
        FinalNorm(
            norm.kind,
            norm.weight.to(device),
            None if norm.bias is None else norm.bias.to(device),
            norm.eps,
        ),
        w_u.to(device),
        None if b_u is None else b_u.to(device),
        mode,
        x_final,
        adapter.final_softcap,
    )


@dataclass(frozen=True)
class _Run:
    """One captured prompt at its analysed (last) position, with its target and labels."""

    loaded: LoadedModel
    cache: RunCache
    encoded: Encoded
    projector: VocabProjector
    target: int
    structure: IclStructure
    k: int

    @cached_property
    def pre_logits(self) -> Tensor:
        """bs(resid_pre_l) at the last position for every layer [L, V]: the base of the
        attention layers, of every head and of every subheadvalue."""
        return self.projector.logits(self.cache.resid_pre[:, 0, self.last])

    @property
    def last(self) -> int:
        return len(self.encoded.texts) - 1

    @property
    def label_positions(self) -> list[int]:
        return [span.position for span in self.structure.labels]

    def is_true(self, position: int) -> bool:
        return int(self.encoded.ids[position]) == self.target

    def margin_ids(self) -> tuple[int, int] | None:
        """(target-side label, other label) token ids when the prompt has exactly two labels."""
        ids = list(dict.fromkeys(int(self.encoded.ids[p]) for p in self.label_positions))
        if len(ids) != 2:
            return None
        return (ids[1], ids[0]) if ids[1] == self.target else (ids[0], ids[1])

    def w_o(self, layer: int) -> Tensor:
        """Each head's write into the residual per unit of z (W_O, post-norm γ folded in)."""
        g = self.loaded.geometry
        return self.loaded.adapter.w_out(self.loaded.model, layer, g).to(self.cache.z.device)

    def kv_index(self) -> Tensor:
        g = self.loaded.geometry
        return torch.tensor([g.kv_head(h) for h in range(g.n_heads)])

    def tops(self, summary: VocabSummary, *index: int) -> list[dict[str, Any]]:
        """The top tokens of one projected vector, as TopToken fields (~16,000 per analysis:
        validated in one pass with their HeadDetail, much faster than one model each)."""
        ids, values = summary.top_lists
        for i in index:
            ids, values = ids[i], values[i]
        text = self.loaded.token_text
        return [{"id": i, "token": text(i), "value": v} for i, v in zip(ids, values, strict=True)]


def layer_increases(run: _Run) -> list[LayerIncrease]:
    """I(attn_l | resid_pre_l) and I(ffn_l | resid_mid_l) for every layer (paper Fig. 2)."""
    c, last = run.cache, run.last
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


def layer_flows(run: _Run) -> list[LayerFlow]:
    """Information flow per layer (demonstrations → labels → last token), heads averaged."""
    flow = information_flow(run.cache.pattern[:, 0], run.label_positions)
    columns = {name: flow.mean[name].tolist() for name in FLOWS}
    columns |= {f"{name}_mass": flow.mass[name].tolist() for name in FLOWS}
    n_layers = run.cache.pattern.shape[0]
    return [
        LayerFlow(layer=layer, **{key: values[layer] for key, values in columns.items()})
        for layer in range(n_layers)
    ]


def _mrr(run: _Run, ranks: Tensor) -> list[LabelMrr]:
    """MRR per label token from the ranks [n_labels] of each position's own label."""
    per_label: dict[int, list[int]] = {}
    for position, rank in zip(run.label_positions, ranks.tolist(), strict=True):
        per_label.setdefault(int(run.encoded.ids[position]), []).append(rank)
    return [
        LabelMrr(label=run.loaded.token_text(label), mrr=mean_reciprocal_rank(r))
        for label, r in per_label.items()
    ]


def _layer_qk(run: _Run, layer: int) -> LayerQk | None:
    """What `layer` scored with, or None for a family whose attention does not go through
    transformers' AttentionInterface (GPT-J before transformers 5.24): then it has no QK scores."""
    assert run.cache.qk is not None, "analyze captures with record_qk=True"
    record = run.cache.qk[layer]
    return record if record.query is not None and record.key is not None else None


def score_fields(split: ScoreSplit | None) -> dict[str, list[float | None] | None]:
    """The HeadDetail score fields of one head (empty without recorded scores)."""
    if split is None:
        return {"scores": [], "content_scores": [], "position_scores": None}
    return {
        "scores": split.values(split.score),
        "content_scores": split.values(split.content),
        "position_scores": None if split.position is None else split.values(split.position),
    }


def _unrotate(record: LayerQk) -> Unrotate | None:
    """Un-rotation by `record`'s rotary angles, None for a layer without rotary."""
    return None if record.rotary is None else partial(rotate, record, inverse=True)


def head_scores(run: _Run, layer: int, head: int) -> ScoreSplit | None:
    """The last position's pre-softmax scores of `head`, split into content and position."""
    record, last = _layer_qk(run, layer), run.last
    if record is None or record.query is None or record.key is None:
        return None
    mask = None
    if record.mask is not None:
        mask = record.mask[0, min(head, record.mask.shape[1] - 1), last, : last + 1]
    return score_split(
        query=record.query[0, head, last],
        keys=record.key[0, run.loaded.geometry.kv_head(head), : last + 1],
        scaling=record.scaling,
        softcap=record.softcap,
        mask=mask,
        unrotate=_unrotate(record),
    )


#: Rotary-aware query views are made for at most this many labels, the nearest to the last
#: position (each is one more vocabulary projection per detailed head).
MAX_OFFSET_VIEWS = 4


def offset_labels(run: _Run) -> list[int]:
    """The label positions that get a rotary-aware query view: the MAX_OFFSET_VIEWS last."""
    return run.label_positions[-MAX_OFFSET_VIEWS:]


def offset_queries(run: _Run, layer: int, head: int, w_k: Tensor) -> Tensor | None:
    """W_K^⊤ R_Δ q for each of `offset_labels` (Δ = last − p): [P, D], None without rotary."""
    record, labels = _layer_qk(run, layer), offset_labels(run)
    if record is None or record.query is None or not labels:
        return None
    unrotate = _unrotate(record)
    if unrotate is None:
        return None
    query = record.query[0, head, run.last]
    return rotary_offset_queries(query=query, positions=labels, w_k=w_k, unrotate=unrotate)


def real_queries(run: _Run, heads: list[tuple[int, int]], w_k: dict[int, Tensor]) -> Tensor:
    """W_K^⊤ q of each of `heads` at the last position, [K, D], q the model's real query (after
    any q-norm, before rotary)."""
    adapter, model, g = run.loaded.adapter, run.loaded.model, run.loaded.geometry
    queries = []
    for layer, head in heads:
        x_hat = run.cache.normalized[layer, 0, run.last, None, None]  # [1, 1, D]
        with torch.inference_mode():
            query = adapter.project_qkv(model, layer, g, x_hat, x_hat)[0][0, 0, head]
        query = query.to(x_hat.device, torch.float32)  # layers may sit on several devices
        queries.append(w_k[layer][g.kv_head(head)].to(query.device) @ query)
    return torch.stack(queries)


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


#: A recurring head's U_h is built where it pays for itself within this many more prompts: it
#: costs d_head rows of the unembedding once and saves n (1 − d_head / D) a prompt (n: the
#: head's vectors projected per prompt, all positions for a detailed head, the labels for a
#: baseline head). Where building it and projecting through it already cost less than the n
#: direct rows (d_head ≤ n (1 − d_head / D): long prompts), it is built at first sight.
PAYBACK_PROMPTS = 4


def factored_values(
    *,
    kept: HeadUnembeddings,
    projector: VocabProjector,
    geometry: HeadGeometry,
    heads: list[tuple[int, int]],
    values: Tensor,
    v: Tensor,
    w_o: dict[int, Tensor],
    attn_scale: Tensor,
) -> FactoredValues | None:
    """The heads' values [K, n, D], those of heads detailed before projected through their
    U_h from `kept` (fixed mode, and where d_head ≤ PAYBACK_PROMPTS · n; at first sight where
    that is cheaper already); None: all as they are. v [L, n, n_kv, d_head] at the values'
    positions, w_o per layer [H, d_head, D], attn_scale [L, 1] at the analysed position."""
    n, d_head = v.shape[1], geometry.d_head
    if projector.mode != "fixed" or d_head > PAYBACK_PROMPTS * n:
        return None
    at_first_sight = d_head <= n * (1 - d_head / geometry.d_model)
    unembeddings = [
        kept.recurring(
            (layer, head),
            partial(head_unembedding, projector, w_o[layer][head]),
            at_first_sight=at_first_sight,
        )
        for layer, head in heads
    ]
    if all(u is None for u in unembeddings):
        return None
    z = torch.stack(
        [v[layer][:, geometry.kv_head(head)] * attn_scale[layer] for layer, head in heads]
    )  # [K, n, d_head]
    return FactoredValues(values, z, unembeddings)


def unembedding_builder(loaded: LoadedModel) -> Callable[[tuple[int, int]], Tensor] | None:
    """Builds the U_h of a head (layer, head) of `loaded` from its weights alone, as
    `factored_values` does in an analysis: for `HeadUnembeddings.build_seen` between jobs.
    None where the weights span several devices (an analysis builds U_h on its capture's)."""
    devices = {p.device for p in loaded.model.parameters()}
    if len(devices) != 1:
        return None
    (device,) = devices
    g = loaded.geometry
    # U_h does not involve the frozen final scale: any final residual serves
    projector = final_projector(loaded, torch.ones(g.d_model, device=device), "fixed")
    w_o: dict[int, Tensor] = {}

    def build(key: tuple[int, int]) -> Tensor:
        layer, head = key
        if layer not in w_o:
            w_o[layer] = loaded.adapter.w_out(loaded.model, layer, g).to(device)
        return head_unembedding(projector, w_o[layer][head])

    return build


def head_details(run: _Run, heads: list[tuple[int, int]], increases: Tensor) -> list[HeadDetail]:
    """Per-position contributions and the Table 1 vocabulary views of `heads`, batched."""
    if not heads:
        return []
    c, last, g = run.cache, run.last, run.loaded.geometry
    labels, kv = run.label_positions, run.kv_index()
    label_ids = run.encoded.ids[labels]
    layers = sorted({layer for layer, _ in heads})
    w_o = {layer: run.w_o(layer) for layer in layers}
    adapter, model = run.loaded.adapter, run.loaded.model
    w_k = {layer: adapter.qkv(model, layer, g).w_k for layer in layers}
    randoms = random_heads(heads, g.n_heads)
    random_layers = list(randoms)
    scale = c.attn_scale[:, 0, last]  # [L, 1]

    def values_of(chosen: list[tuple[int, int]], v: Tensor) -> tuple[Tensor, FactoredValues | None]:
        """The values of `chosen` heads from v [L, n, n_kv, d_head], and them factored."""
        values = head_values(v=v, w_o=w_o, kv_index=kv, attn_scale=scale, heads=chosen)
        factored = factored_values(
            kept=run.loaded.head_unembeddings,
            projector=run.projector,
            geometry=g,
            heads=chosen,
            values=values,
            v=v,
            w_o=w_o,
            attn_scale=scale,
        )
        return values, factored

    values, factored = values_of(heads, c.v[:, 0])
    baseline: Tensor | FactoredValues | None = None  # the random heads' values at the labels
    if randoms:
        plain, baseline = values_of(list(randoms.items()), c.v[:, 0][:, labels])
        baseline = plain if baseline is None else baseline

    offsets = [offset_queries(run, layer, head, w_k[layer][int(kv[head])]) for layer, head in heads]
    rotary = all(o is not None for o in offsets) and bool(labels)
    layer_of = [layer for layer, _ in heads]
    rows = torch.stack([c.pattern[layer, 0, head, last] for layer, head in heads])  # [K, S]
    views = head_views(
        projector=run.projector,
        values=values if factored is None else factored,
        rows=rows,
        bases=c.resid_pre[layer_of, 0, last],
        base_logits=run.pre_logits[layer_of],
        label_positions=labels,
        label_ids=label_ids,
        target=run.target,
        k=run.k,
        margin_ids=run.margin_ids(),
        random_values=baseline,
        queries=real_queries(run, heads, w_k),
        offsets=torch.stack([o for o in offsets if o is not None]) if rotary else None,
        keys=c.normalized[layers, 0][:, labels],
        prior=torch.stack([c.attn_out[:layer, 0][:, labels].sum(0) for layer in layers]),
        resid_pre=c.resid_pre[layers, 0, last],
    )
    texts = run.encoded.texts
    per_position, margin = views.contribution.increase, views.contribution.margin
    details = []
    for i, (layer, head) in enumerate(heads):
        j = layers.index(layer)
        attention, increase = rows[i, : last + 1].tolist(), per_position[i].tolist()
        margins = [None] * (last + 1) if margin is None else margin[i].tolist()
        details.append(  # nested fields as plain values: validated in one pass
            HeadDetail.model_validate(
                {
                    "layer": layer,
                    "head": head,
                    "name": head_name(layer, head),
                    "increase": float(increases[layer, head]),
                    "attention": attention,
                    "positions": [
                        {
                            "position": p,
                            "token": texts[p],
                            "attention": attention[p],
                            "increase": increase[p],
                            "margin": margins[p],
                        }
                        for p in range(last + 1)
                    ],
                    "values": [
                        {
                            "position": p,
                            "token": texts[p],
                            "is_true": run.is_true(p),
                            "label_rank": int(views.value.ranks[i, n]),
                            "value": run.tops(views.value, i, n),
                            "weighted_value": run.tops(views.weighted, i, n),
                        }
                        for n, p in enumerate(labels)
                    ],
                    "keys": [
                        {
                            "position": p,
                            "token": texts[p],
                            "is_true": run.is_true(p),
                            "normalized_input": run.tops(views.key, j, n),
                            "prior_attention": run.tops(views.prior, j, n) if layer else [],
                        }
                        for n, p in enumerate(labels)
                    ],
                    "query": run.tops(views.query, i),
                    "query_by_offset": [
                        {
                            "position": p,
                            "token": texts[p],
                            "is_true": run.is_true(p),
                            "offset": last - p,
                            "query": run.tops(views.offset, i, n),
                        }
                        for n, p in enumerate(offset_labels(run))
                    ]
                    if views.offset is not None
                    else [],
                    "resid_pre": run.tops(views.resid_pre, j),
                    "value_mrr": _mrr(run, views.value.ranks[i]),
                    "random_head": head_name(layer, randoms[layer]) if layer in randoms else None,
                    "random_head_mrr": _mrr(run, views.random.ranks[random_layers.index(layer)])
                    if views.random is not None and layer in randoms
                    else [],
                    **score_fields(head_scores(run, layer, head)),
                }
            )
        )
    return details


def analyze(
    loaded: LoadedModel,
    prompt: str,
    *,
    target: str | None = None,
    labels: list[str] | None = None,
    norm: NormMode = "fixed",
    top_k_heads: int = 20,
    top_k_tokens: int = 10,
    extra_heads: list[str] | None = None,
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    rank_by: RankBy = "increase",
    on_heads: Callable[[AnalysisResult], None] | None = None,
) -> AnalysisResult:
    """Locate-and-project on `prompt` at its last position (DESIGN.md, "Analysis definitions").

    `rank_by="label"` ranks the heads (and picks the detailed top K) by their label increase.
    Two stages: the tokens, layer and per-head increases (what the heatmap and the top-heads
    table need), then the details of the top and extra heads. `on_heads`, if given, receives
    the first stage's result (`head_details` empty) before the details are computed.

    Raises a UserInputError subclass with one clear line for bad input.
    """
    g = loaded.geometry
    extra = parse_head_names(extra_heads or [], g.n_layers, g.n_heads)
    encoded = encode_prompt(loaded, prompt, max_tokens)
    structure = detect_structure(prompt, encoded.offsets, labels)
    with loaded.lock:
        ids = encoded.ids[None].to(loaded.device)
        cache = run_with_cache(
            loaded.model, loaded.adapter, g, ids, logits_to_keep=1, record_qk=True
        )
    logprobs = torch.log_softmax(cache.logits[0, -1], -1)  # the last position's
    warnings: list[str] = []
    if target is None:
        target_token = int(logprobs.argmax())
    else:
        target_token, target_warnings = target_id(loaded, prompt, target)
        warnings += target_warnings
    warnings += [
        f"label {span.word!r} at position {span.position} is several tokens; its first token "
        "is its label position"
        for span in structure.labels
        if len(loaded.tokenizer(" " + span.word, add_special_tokens=False)["input_ids"]) > 1
    ]
    demonstrations = demonstration_texts(prompt, structure)
    projector = final_projector(loaded, cache.resid_final[0, -1], norm)
    run = _Run(loaded, cache, encoded, projector, target_token, structure, top_k_tokens)
    c, last = cache, run.last
    resid_pre = c.resid_pre[:, 0, last]
    writes = head_writes(
        z=c.z[:, 0, last] * c.attn_scale[:, 0, last],
        v=c.v[:, 0],
        pattern_row=c.pattern[:, 0, :, last],
        attn_scale=c.attn_scale[:, 0, last],
        w_o=[run.w_o(layer) for layer in range(g.n_layers)],
        kv_index=run.kv_index(),
        label_positions=run.label_positions,
    )
    increases = head_increases(
        projector=projector,
        resid_pre=resid_pre,
        writes=writes,
        target=target_token,
        pre_logits=run.pre_logits,
    )

    def split_by_label() -> LabelSplit:
        return label_split(
            projector=projector,
            resid_pre=resid_pre,
            writes=writes,
            whole=increases,
            target=target_token,
            pre_logits=run.pre_logits,
        )

    split = split_by_label() if rank_by == "label" else None  # else after the per-head stage
    attn_true, attn_false = attention_sums(
        pattern_row=c.pattern[:, 0, :, last],
        true_positions=[p for p in run.label_positions if run.is_true(p)],
        false_positions=[p for p in run.label_positions if not run.is_true(p)],
    )
    ranking = increases.increase if split is None else split.label
    order = ranking.flatten().argsort(descending=True).tolist()
    columns = {"increase": increases.increase, "attn_true": attn_true, "attn_false": attn_false}
    summaries = head_summaries(g.n_heads, order, columns, split)
    top = [(s.layer, s.head) for s in summaries[:top_k_heads]]
    margin = run.margin_ids()
    heads_stage = AnalysisResult(
        model=loaded.name,
        n_layers=g.n_layers,
        n_heads=g.n_heads,
        norm=norm,
        rank_by=rank_by,
        prompt=prompt,
        tokens=[
            TokenInfo(position=p, id=i, text=t)
            for p, (i, t) in enumerate(zip(encoded.ids.tolist(), encoded.texts, strict=True))
        ],
        target=Target(
            id=target_token,
            token=loaded.token_text(target_token),
            logprob=float(logprobs[target_token]),
            prob=float(logprobs[target_token].exp()),
            source="predicted" if target is None else "given",
        ),
        separator=structure.separator,
        labels=[
            LabelInfo(
                position=s.position,
                token=encoded.texts[s.position],
                word=s.word,
                is_true=run.is_true(s.position),
                demonstration=text,
            )
            for s, text in zip(structure.labels, demonstrations, strict=True)
        ],
        margin_labels=None if margin is None else [loaded.token_text(i) for i in margin],
        layers=layer_increases(run),
        flow=layer_flows(run),
        heads=summaries,
        top_heads=[head_name(layer, head) for layer, head in top],
        head_details={},
        warnings=warnings,
    )
    if on_heads is not None:
        on_heads(heads_stage)
    if split is None:
        summaries = head_summaries(g.n_heads, order, columns, split_by_label())
    details = head_details(run, list(dict.fromkeys(top + extra)), increases.increase)
    return heads_stage.model_copy(
        update={"heads": summaries, "head_details": {d.name: d for d in details}}
    )
