"""The detailed heads' stage: per-position contributions and the Table 1 vocabulary views of
the top (and extra) heads, computed in one batch, then assembled per head."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from model_worker.analysis.baseline import random_heads
from model_worker.analysis.details import HeadViews, head_values, head_views
from model_worker.analysis.head_unembedding import FactoredValues
from model_worker.analysis.metrics import on_host
from model_worker.analysis.scores import ScoreSplit, ScoreSplits
from model_worker.contracts.analysis import HeadDetail
from model_worker.contracts.common import head_name
from model_worker.model.loading import LoadedModel
from model_worker.resources.device_index import index_on
from model_worker.resources.device_memory import ensure_room, room_for
from model_worker.run.assembly import head_detail
from model_worker.run.factored import factored_values
from model_worker.run.queries import HeadScores, head_offset_queries, head_scores, real_queries
from model_worker.run.state import PromptRun
from model_worker.towers.run import detail_towers

#: Share of the device's free memory the recurring heads' U_h may grow to, beyond the configured
#: budget, so that one analysis's heads (K + a baseline per detailed layer) all stay kept.
UNEMBEDDING_SHARE = 0.25


def head_details(
    run: PromptRun,
    heads: list[tuple[int, int]],
    increases: Tensor,
    label_keys: list[tuple[int, int]] | None = None,
    studied: list[tuple[int, int]] | None = None,
) -> list[HeadDetail]:
    """Per-position contributions and the Table 1 vocabulary views of `heads`, batched; the
    label-key tables of those in `label_keys` only (None: of every head), the others' `keys`
    None (computed on demand). `studied`: every head the analysis details (default: `heads`),
    which a layer's random baseline head is drawn outside of, so that a few of an analysis'
    heads detailed later (`model_worker.run.more_heads`) get the baseline the whole would."""
    if not heads:
        return []
    c, g = run.cache, run.loaded.geometry
    last, row = c.at(run.last), c.row(run.last)  # indices on the kept positions and rows
    labels, kv = run.label_positions, run.kv_index()
    layers = sorted({layer for layer, _ in heads})
    keyed = set(heads if label_keys is None else label_keys) & set(heads)
    key_layers = sorted({layer for layer, _ in keyed})  # the layers whose label keys are read
    at_labels = c.at_each(labels) if key_layers else []  # kept only when keys are asked
    ensure_room(
        c.z.device,
        weight_copy_bytes(run.loaded, len(layers)),
        f"fp32 copies of the W_O and W_K of {len(layers)} detailed layers",
    )
    w_o = {layer: run.w_o(layer) for layer in layers}
    adapter, model = run.loaded.adapter, run.loaded.model
    w_k = {layer: adapter.w_k(model, layer, g) for layer in layers}
    drawn = random_heads(heads if studied is None else studied, g.n_heads)
    randoms = {layer: drawn[layer] for layer in layers if layer in drawn}
    random_layers = list(randoms)
    room = room_for(c.v.device, UNEMBEDDING_SHARE, 0)  # U_h for every head this analysis projects
    unit = g.d_head * run.projector.vocab * 4
    run.loaded.head_unembeddings.reserve(len(heads) + len(randoms), unit, room)
    scale = c.attn_scale[:, 0, last]  # [L, 1]

    def values_of(chosen: list[tuple[int, int]], v: Tensor) -> Tensor | FactoredValues:
        """The values of `chosen` heads from v [L, n, n_kv, d_head], factored where their U_h
        are at hand (then only the others' values are computed)."""

        def plain(some: list[tuple[int, int]]) -> Tensor:
            return head_values(v=v, w_o=w_o, kv_index=kv, attn_scale=scale, heads=some)

        factored = factored_values(
            kept=run.loaded.head_unembeddings,
            projector=run.projector,
            geometry=g,
            heads=chosen,
            values=plain,
            v=v,
            w_o=w_o,
            attn_scale=scale,
        )
        return plain(chosen) if factored is None else factored

    values = values_of(heads, c.v[:, 0])
    baseline = values_of(list(randoms.items()), c.v[:, 0][:, labels]) if randoms else None

    offsets = head_offset_queries(run, heads, w_k)
    layer_of = [layer for layer, _ in heads]
    at = c.pattern.device
    rows = c.pattern[:, 0, :, row][  # [K, S]
        index_on(layer_of, at), index_on([head for _, head in heads], at)
    ]
    views = head_views(
        projector=run.projector,
        values=values,
        rows=rows,
        bases=c.resid_pre[layer_of, 0, last],
        base_logits=run.pre_logits[layer_of],
        label_positions=labels,
        label_ids=run.encoded.ids[labels],
        target=run.target,
        k=run.k,
        margin_ids=run.margin_ids(),
        random_values=baseline,
        queries=real_queries(run, heads, w_k),
        offsets=offsets,
        keys=c.normalized[key_layers, 0][:, at_labels],
        prior=prior_attention(run, key_layers, at_labels),
        resid_pre=c.resid_pre[layers, 0, last],
    )
    splits = head_scores(run, heads)
    views, host = to_host(run, heads, increases, rows, views, splits)
    del values, baseline, rows, offsets  # the details' tensors, done with
    return [
        head_detail(
            run,
            views,
            i=i,
            j=layers.index(layer),
            key_j=key_layers.index(layer) if (layer, head) in keyed else None,
            layer=layer,
            head=head,
            increase=host.increases[i],
            attention=host.attention[i],
            per_position=host.per_position[i],
            margins=None if host.margins is None else host.margins[i],
            scores=host.scores[i],
            random_head=(
                (head_name(layer, randoms[layer]), random_layers.index(layer))
                if layer in randoms
                else None
            ),
        )
        for i, (layer, head) in enumerate(heads)
    ]


def weight_copy_bytes(loaded: LoadedModel, layers: int) -> int:
    """Bytes of the fp32 W_O and W_K of `layers` layers that the details keep while they run:
    copies where the model's weights are not fp32 (an 8B's in bf16: 80 MiB a layer), none
    where they are (then they are the weights themselves)."""
    if next(loaded.model.parameters()).dtype == torch.float32:
        return 0
    g = loaded.geometry
    return 4 * layers * (g.n_heads + g.n_kv_heads) * g.d_head * g.d_model


@dataclass(frozen=True)
class HostValues:
    """The detailed heads' per-position numbers as plain floats, per head: increases [K],
    attention, per-position increases and label margins (None: none) [K][last + 1]."""

    increases: list[float]
    attention: list[list[float]]
    per_position: list[list[float]]
    margins: list[list[float]] | None
    scores: list[ScoreSplit | None]


#: HeadViews' top-token summaries, moved to the host with the per-position numbers at once.
SUMMARIES = ("value", "weighted", "random", "query", "offset", "key", "prior", "resid_pre")


def to_host(
    run: PromptRun,
    heads: list[tuple[int, int]],
    increases: Tensor,
    rows: Tensor,
    views: HeadViews,
    splits: HeadScores,
) -> tuple[HeadViews, HostValues]:
    """`views` on the host, and `heads`' increases (of `increases` [L, H]), attention `rows`
    [K, S] and per-position increases and margins as plain floats, and their score `splits`
    on the host: one device→host transfer for the whole details stage (`on_host`), each
    converted to lists once."""
    width = run.last + 1
    index = torch.tensor([layer * increases.shape[1] + head for layer, head in heads])
    contribution = views.contribution
    floats = [
        increases.flatten()[index.to(increases.device)],
        rows[:, :width],
        contribution.increase[:, :width],
        *([] if contribution.margin is None else [contribution.margin[:, :width]]),
    ]
    n_floats = len(floats)
    parts = [
        [s.score, s.content, s.excluded, *([] if s.position is None else [s.position])]
        for _, s in splits.groups
    ]
    named = {name: getattr(views, name) for name in SUMMARIES}
    present = {name: summary for name, summary in named.items() if summary is not None}
    moved, listed = on_host(list(present.values()), floats + [t for p in parts for t in p])
    changes: dict[str, Any] = dict(zip(present, moved, strict=True))
    views = replace(views, **changes)
    per_head = [t.tolist() for t in listed[:n_floats]]
    at, groups = n_floats, []
    for (indices, _), part in zip(splits.groups, parts, strict=True):  # the host's copies
        score, content, excluded, *position = listed[at : at + len(part)]
        at += len(part)
        remainder = position[0] if position else None
        groups.append((indices, ScoreSplits(score, content, remainder, excluded.bool())))
    scores = HeadScores(groups).per_head(len(heads))
    return views, HostValues(
        increases=per_head[0],
        attention=per_head[1],
        per_position=per_head[2],
        margins=per_head[3] if n_floats > 3 else None,
        scores=scores,
    )


def prior_attention(run: PromptRun, layers: list[int], at: list[int]) -> Tensor:
    """The sum of the attention outputs before each of `layers` at kept positions `at`
    [len(layers), len(at), D] (the released code's key view; layer 0's is zero)."""
    c = run.cache
    if not layers:
        return c.attn_out.new_zeros(0, len(at), c.attn_out.shape[-1])
    return torch.stack([c.attn_out[:layer, 0][:, at].sum(0) for layer in layers])


def with_towers(
    run: PromptRun, detail: HeadDetail, position: int | None = None, versus: int | None = None
) -> HeadDetail:
    """`detail` with its score decomposed into the two towers (docs/towers.md): at `position`
    (default: the label it attends to most), and that minus `versus` (default: the top true
    label versus the top false one)."""
    labels = [(p, run.is_true(p)) for p in run.label_positions]
    texts = run.encoded.texts
    found = detail_towers(
        run.loaded, run.cache, detail.layer, detail.head, texts, labels, position, versus
    )
    return detail.model_copy(update={"towers": found})
