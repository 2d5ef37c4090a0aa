"""`analyze()`: locate-and-project on one prompt → an AnalysisResult (plain floats, top-k lists).

Work is batched so that each pass over the unembedding serves many vectors: all heads at once
for the head ranking, all (head, position) pairs of the detailed heads at once, and every
top-token table of the detailed heads in one more batch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from app.contracts import (
    AnalysisResult,
    HeadDetail,
    HeadSummary,
    KeyProjection,
    LabelInfo,
    LabelMrr,
    LayerFlow,
    LayerIncrease,
    NormMode,
    OffsetQuery,
    PositionContribution,
    RankBy,
    Target,
    TokenInfo,
    TopToken,
    ValueProjection,
    head_name,
)
from model_worker.analysis.contributions import (
    head_outputs,
    logprob_increase,
    position_views_fixed,
    positions_z,
    split_increase,
    subhead_values,
    value_outputs,
)
from model_worker.analysis.flow import FLOWS, information_flow
from model_worker.analysis.icl import IclStructure, demonstration_texts, detect_structure
from model_worker.analysis.metrics import (
    VocabSummary,
    block_rows,
    mean_reciprocal_rank,
    summarize_projections,
)
from model_worker.analysis.projection import FinalNorm, VocabProjector
from model_worker.analysis.scores import ScoreSplit, attention_scores, masked
from model_worker.capture import RunCache, run_with_cache
from model_worker.loading import LoadedModel
from model_worker.prompting import Encoded, encode_prompt, parse_head_names, target_id
from model_worker.qk import LayerQk, rotate


def final_projector(loaded: LoadedModel, x_final: Tensor, mode: NormMode) -> VocabProjector:
    """The VocabProjector of `loaded` at the analysed position's final residual `x_final` [D]."""
    adapter, device = loaded.adapter, x_final.device
    norm = adapter.final_norm(loaded.model)
    w_u, b_u = adapter.unembedding(loaded.model)
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


class _Projections:
    """Vectors queued for one batched projection; `run()` answers every queue at once."""

    def __init__(self) -> None:
        self._vectors: list[Tensor] = []
        self._rank_ids: list[Tensor] = []
        self._shapes: dict[str, tuple[int, ...]] = {}

    def add(self, name: str, vectors: Tensor, rank_ids: Tensor | None = None) -> None:
        """Queue `vectors` [..., D] under `name`, ranking `rank_ids` [...] if given."""
        shape = tuple(vectors.shape[:-1])
        self._shapes[name] = shape
        self._vectors.append(vectors.reshape(-1, vectors.shape[-1]))
        ids = rank_ids if rank_ids is not None else torch.full(shape, -1, dtype=torch.long)
        self._rank_ids.append(ids.reshape(-1).to(torch.long).cpu())

    def run(self, projector: VocabProjector, k: int) -> dict[str, VocabSummary]:
        summary = summarize_projections(
            projector.project,
            torch.cat(self._vectors),
            k,
            torch.cat(self._rank_ids).to(self._vectors[0].device),
            block_rows(projector.vocab, self._vectors[0].device),
        )
        out, start = {}, 0
        for name, shape in self._shapes.items():
            size = math.prod(shape)
            out[name] = summary.rows(start, start + size).reshaped(shape)
            start += size
        return out


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

    def z(self, layer: int) -> Tensor:
        """z at the last position with the post-norm scale frozen there: [H*d_head]."""
        return self.cache.z[layer, 0, self.last] * self.cache.attn_scale[layer, 0, self.last]

    def kv_index(self) -> Tensor:
        g = self.loaded.geometry
        return torch.tensor([g.kv_head(h) for h in range(g.n_heads)])

    def tops(self, summary: VocabSummary, *index: int) -> list[TopToken]:
        ids, values = summary.top_ids[index].tolist(), summary.top_values[index].tolist()
        text = self.loaded.token_text
        # ~16,000 per analysis: built from plain ints, strs and floats, so not re-validated
        return [
            TopToken.model_construct(id=i, token=text(i), value=v)
            for i, v in zip(ids, values, strict=True)
        ]


def layer_increase_table(
    projector: VocabProjector,
    cache: RunCache,
    row: int,
    position: int,
    target: int,
    pre_logits: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """I(attn_l | resid_pre_l) and I(ffn_l | resid_mid_l) [L] each, at `position` of batch row
    `row` (paper Fig. 2); `pre_logits` [L, V], when known, spare projecting resid_pre again."""
    pre, attn_out = cache.resid_pre[:, row, position], cache.attn_out[:, row, position]
    attn = logprob_increase(
        projector, pre, attn_out[:, None], target, base_logits=pre_logits
    ).increase[:, 0]
    mlp_out = cache.mlp_out[:, row, position, None]
    ffn = logprob_increase(projector, pre + attn_out, mlp_out, target).increase[:, 0]
    return attn, ffn


def layer_increases(run: _Run) -> list[LayerIncrease]:
    """I(attn_l | resid_pre_l) and I(ffn_l | resid_mid_l) for every layer (paper Fig. 2)."""
    attn, ffn = layer_increase_table(
        run.projector, run.cache, 0, run.last, run.target, run.pre_logits
    )
    return [
        LayerIncrease(layer=layer, attn_increase=a, ffn_increase=f)
        for layer, (a, f) in enumerate(zip(attn.tolist(), ffn.tolist(), strict=True))
    ]


@dataclass(frozen=True)
class HeadIncreases:
    """[L, H] each: I(head | resid_pre) (paper Fig. 3/4), and the same I of the head restricted
    to the label positions (`label`) and to every other position (`other`)."""

    total: Tensor
    label: Tensor
    other: Tensor

    def ranking(self, rank: RankBy) -> Tensor:
        """The [L, H] scores that rank the heads."""
        return self.label if rank == "label" else self.total


def head_increases(run: _Run) -> HeadIncreases:
    """Every head's increase, whole and split into its label positions and the rest."""
    c, last, kv = run.cache, run.last, run.kv_index()
    labels = run.label_positions
    heads, label_parts = [], []
    for layer in range(c.z.shape[0]):
        w_o = run.w_o(layer)
        z_label = positions_z(c.v[layer, 0], c.pattern[layer, 0, :, last], kv, labels)
        z_label = z_label * c.attn_scale[layer, 0, last]  # the post-norm scale, as run.z
        both = head_outputs(torch.stack([run.z(layer), z_label]), w_o)  # [2, H, D]
        heads.append(both[0])
        label_parts.append(both[1])
    total, label, other = split_increase(
        run.projector,
        c.resid_pre[:, 0, last],
        torch.stack(heads),
        torch.stack(label_parts),
        run.target,
        base_logits=run.pre_logits,
    )
    return HeadIncreases(total, label, other)


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


def attention_sums(run: _Run) -> tuple[Tensor, Tensor]:
    """Attention of the last position on true and on false labels: two [L, H]."""
    row = run.cache.pattern[:, 0, :, run.last, :]  # [L, H, S]
    true = [p for p in run.label_positions if run.is_true(p)]
    false = [p for p in run.label_positions if not run.is_true(p)]
    return row[..., true].sum(-1), row[..., false].sum(-1)


def _random_heads(heads: list[tuple[int, int]], n_heads: int) -> dict[int, int]:
    """One comparison head per layer of `heads`: drawn (seeded by the layer) among that layer's
    heads that are not detailed, i.e. not among the located in-context heads; layers whose heads
    are all detailed get none."""
    detailed = set(heads)
    chosen = {}
    for layer in sorted({layer for layer, _ in heads}):
        others = [h for h in range(n_heads) if (layer, h) not in detailed]
        if others:
            chosen[layer] = random.Random(layer).choice(others)
    return chosen


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
    transformers' AttentionInterface (e.g. GPT-J): then it has no QK scores."""
    assert run.cache.qk is not None, "analyze captures with record_qk=True"
    record = run.cache.qk[layer]
    return record if record.query is not None and record.key is not None else None


def head_scores(run: _Run, layer: int, head: int) -> ScoreSplit | None:
    """The last position's pre-softmax scores of `head`, split into content and position."""
    record, last = _layer_qk(run, layer), run.last
    if record is None or record.query is None or record.key is None:
        return None
    query = record.query[0, head, last]  # [d], after rotary
    keys = record.key[0, run.loaded.geometry.kv_head(head), : last + 1]  # [S, d]
    mask = None
    if record.mask is not None:
        mask = record.mask[0, min(head, record.mask.shape[1] - 1), last, : last + 1]
    excluded = masked(mask, last + 1)
    score = attention_scores(query, keys, record.scaling, record.softcap, mask)
    if record.rotary is None:
        return ScoreSplit(score, score, None, excluded)
    plain_query = rotate(record, query[None, None], [last], inverse=True)[0, 0]
    plain_keys = rotate(record, keys[None], range(last + 1), inverse=True)[0]
    content = attention_scores(plain_query, plain_keys, record.scaling, record.softcap, mask)
    return ScoreSplit(score, content, score - content, excluded)


#: Rotary-aware query views are made for at most this many labels, the nearest to the last
#: position (each is one more vocabulary projection per detailed head).
MAX_OFFSET_VIEWS = 4


def offset_labels(run: _Run) -> list[int]:
    """The label positions that get a rotary-aware query view: the MAX_OFFSET_VIEWS last."""
    return run.label_positions[-MAX_OFFSET_VIEWS:]


def offset_queries(run: _Run, layer: int, head: int, w_k: Tensor) -> Tensor | None:
    """W_K^⊤ R_Δ q for each of `offset_labels` (Δ = last − p): [P, D], None without rotary.

    With q_last = R_last q the real (rotated) query, R_Δ q = R_{−p} q_last: the query un-rotated
    by the label position's angles, which a key at p scores against its unrotated key.
    """
    record, labels = _layer_qk(run, layer), offset_labels(run)
    if record is None or record.query is None or record.rotary is None or not labels:
        return None
    query = record.query[0, head, run.last]
    seen = rotate(record, query.expand(len(labels), -1)[None], labels, inverse=True)[0]
    return seen @ w_k.to(seen.device).T


def score_fields(split: ScoreSplit | None) -> dict[str, list[float | None] | None]:
    """The HeadDetail score fields of one head (empty without recorded scores)."""
    if split is None:
        return {"scores": [], "content_scores": [], "position_scores": None}
    return {
        "scores": split.values(split.score),
        "content_scores": split.values(split.content),
        "position_scores": None if split.position is None else split.values(split.position),
    }


def head_details(run: _Run, heads: list[tuple[int, int]], increases: Tensor) -> list[HeadDetail]:
    """Per-position contributions and the Table 1 vocabulary views of `heads`, batched."""
    if not heads:
        return []
    c, last, g = run.cache, run.last, run.loaded.geometry
    labels, kv = run.label_positions, run.kv_index()
    label_ids = run.encoded.ids[labels]
    w_o = {layer: run.w_o(layer) for layer in sorted({layer for layer, _ in heads})}

    def values_of(layer: int, head: int) -> Tensor:  # [S, D], post-norm scale frozen at last
        values = value_outputs(c.v[layer, 0], w_o[layer][head : head + 1], kv[head : head + 1])
        return values[0] * c.attn_scale[layer, 0, last]

    values = torch.stack([values_of(layer, head) for layer, head in heads])  # [K, S, D]
    rows = torch.stack([c.pattern[layer, 0, head, last] for layer, head in heads])  # [K, S]
    layer_of = [layer for layer, _ in heads]
    bases = c.resid_pre[layer_of, 0, last]
    label_ranks = label_ids.expand(len(heads), -1)
    batch = _Projections()
    if run.projector.mode == "fixed":  # one projection per value serves all its views
        fast = position_views_fixed(
            run.projector,
            bases,
            values,
            rows,
            run.target,
            labels,
            label_ids,
            run.k,
            run.margin_ids(),
            base_logits=run.pre_logits[layer_of],
        )
        per_position, plain, weighted = fast.contribution, fast.value, fast.weighted
    else:
        per_position = logprob_increase(
            run.projector,
            bases,
            subhead_values(rows, values),
            run.target,
            run.margin_ids(),
            base_logits=run.pre_logits[layer_of],
        )
        batch.add("value", values[:, labels], label_ranks)
        batch.add("weighted", rows[:, labels, None] * values[:, labels])
    randoms = _random_heads(heads, g.n_heads)
    random_layers = list(randoms)
    random_values = [values_of(layer, randoms[layer])[labels] for layer in random_layers]
    adapter, model = run.loaded.adapter, run.loaded.model
    w_k = {layer: adapter.qkv(model, layer, g).w_k for layer in w_o}
    queries, offsets = [], []
    for layer, head in heads:
        x_hat = c.normalized[layer, 0, last, None, None]  # [1, 1, D]
        with torch.inference_mode():  # the model's real query: after any q-norm, before rotary
            query = adapter.project_qkv(model, layer, g, x_hat, x_hat)[0][0, 0, head]
        query = query.to(x_hat.device, torch.float32)  # layers may sit on several devices
        queries.append(w_k[layer][int(kv[head])].to(query.device) @ query)  # W_K^T q, [D]
        offsets.append(offset_queries(run, layer, head, w_k[layer][int(kv[head])]))
    scores = [head_scores(run, layer, head) for layer, head in heads]
    layers = list(w_o)
    prior = torch.stack(
        [c.attn_out[:layer, 0][:, labels].sum(0) for layer in layers]
    )  # sum of earlier attention outputs at each label position, [nL, n_labels, D]
    if random_values:
        batch.add("random", torch.stack(random_values), label_ids.expand(len(randoms), -1))
    batch.add("query", torch.stack(queries))
    rotary = all(o is not None for o in offsets) and bool(labels)
    if rotary:
        batch.add("offset", torch.stack([o for o in offsets if o is not None]))
    batch.add("key", c.normalized[layers, 0][:, labels])
    batch.add("prior", prior)
    batch.add("layer_input", c.resid_pre[layers, 0, last])
    views = batch.run(run.projector, run.k)
    if run.projector.mode == "fixed":
        shape = (len(heads), len(labels))
        views["value"], views["weighted"] = plain.reshaped(shape), weighted.reshaped(shape)
    texts = run.encoded.texts
    details = []
    for i, (layer, head) in enumerate(heads):
        j = layers.index(layer)
        margin = per_position.margin
        details.append(
            HeadDetail(
                layer=layer,
                head=head,
                name=head_name(layer, head),
                increase=float(increases[layer, head]),
                attention=rows[i, : last + 1].tolist(),
                positions=[
                    PositionContribution(
                        position=p,
                        token=texts[p],
                        attention=float(rows[i, p]),
                        increase=float(per_position.increase[i, p]),
                        margin=None if margin is None else float(margin[i, p]),
                    )
                    for p in range(last + 1)
                ],
                values=[
                    ValueProjection(
                        position=p,
                        token=texts[p],
                        is_true=run.is_true(p),
                        label_rank=int(views["value"].ranks[i, n]),
                        value=run.tops(views["value"], i, n),
                        weighted_value=run.tops(views["weighted"], i, n),
                    )
                    for n, p in enumerate(labels)
                ],
                keys=[
                    KeyProjection(
                        position=p,
                        token=texts[p],
                        is_true=run.is_true(p),
                        layer_input=run.tops(views["key"], j, n),
                        prior_attention=run.tops(views["prior"], j, n) if layer else [],
                    )
                    for n, p in enumerate(labels)
                ],
                query=run.tops(views["query"], i),
                query_by_offset=[
                    OffsetQuery(
                        position=p,
                        token=texts[p],
                        is_true=run.is_true(p),
                        offset=last - p,
                        query=run.tops(views["offset"], i, n),
                    )
                    for n, p in enumerate(offset_labels(run))
                ]
                if rotary
                else [],
                layer_input=run.tops(views["layer_input"], j),
                value_mrr=_mrr(run, views["value"].ranks[i]),
                random_head=head_name(layer, randoms[layer]) if layer in randoms else None,
                random_head_mrr=_mrr(run, views["random"].ranks[random_layers.index(layer)])
                if layer in randoms
                else [],
                **score_fields(scores[i]),
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
    max_tokens: int | None = None,
    rank: RankBy = "increase",
    on_heads: Callable[[AnalysisResult], None] | None = None,
) -> AnalysisResult:
    """Locate-and-project on `prompt` at its last position (DESIGN.md, "Analysis definitions").

    `rank="label"` ranks the heads (and picks the detailed top K) by their label increase.
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
    increases = head_increases(run)
    attn_true, attn_false = attention_sums(run)
    order = increases.ranking(rank).flatten().argsort(descending=True).tolist()
    columns = {
        "increase": increases.total,
        "label_increase": increases.label,
        "other_increase": increases.other,
        "attn_true": attn_true,
        "attn_false": attn_false,
    }
    flat_values = {key: value.flatten().tolist() for key, value in columns.items()}
    summaries = [
        HeadSummary(
            layer=flat // g.n_heads,
            head=flat % g.n_heads,
            name=head_name(flat // g.n_heads, flat % g.n_heads),
            rank=position + 1,
            **{key: values[flat] for key, values in flat_values.items()},
        )
        for position, flat in enumerate(order)
    ]
    top = [(s.layer, s.head) for s in summaries[:top_k_heads]]
    margin = run.margin_ids()
    heads_stage = AnalysisResult(
        model=loaded.name,
        n_layers=g.n_layers,
        n_heads=g.n_heads,
        norm=norm,
        rank_by=rank,
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
    details = head_details(run, list(dict.fromkeys(top + extra)), increases.total)
    return heads_stage.model_copy(update={"head_details": {d.name: d for d in details}})
