"""The details stage of an analysis: per-position increases and the Table 1 vocabulary views of
K detailed heads, batched so that each pass over the unembedding serves many vectors.

Pure tensor maths on captured activations and the heads' weights (one prompt, its last
position); the caller reads the model and turns the tensors into the result contract.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from model_worker.analysis.contributions import (
    Increase,
    logprob_increase,
    subhead_values,
    value_outputs,
)
from model_worker.analysis.head_unembedding import FactoredValues
from model_worker.analysis.metrics import (
    VocabSummary,
    block_rows,
    concat,
    summarize_logits,
    summarize_projections,
)
from model_worker.analysis.position_views import direct_value_logits, position_views_fixed
from model_worker.analysis.projection import VocabProjector
from model_worker.analysis.taylor import SmallWrites, small_writes
from model_worker.resources.device_branches import host_bound


def head_values(
    *,
    v: Tensor,
    w_o: dict[int, Tensor],
    kv_index: Tensor,
    attn_scale: Tensor,
    heads: list[tuple[int, int]],
) -> Tensor:
    """The unweighted values v_p W_O^h of `heads` [K, S, D], with the post-norm scale frozen at
    the analysed position: v [L, S, n_kv, d_head], w_o per layer [H, d_head, D], kv_index [H],
    attn_scale [L, 1] (at the analysed position)."""
    return torch.stack(
        [
            value_outputs(v[layer], w_o[layer][head : head + 1], kv_index[head : head + 1])[0]
            * attn_scale[layer]
            for layer, head in heads
        ]
    )


class ProjectionBatch:
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
        """The top-k tokens (and ranks) of every queue, each laid out in its queued shape."""
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


def summarize_factored(
    projector: VocabProjector, values: FactoredValues, rank_ids: Tensor, k: int
) -> VocabSummary:
    """Top-k tokens [R, P, k] and ranks of `rank_ids` [P] of factored values [R, P, D] (fixed
    mode), a block of heads at a time, or of one head's positions where a head's P positions
    exceed a block (a long prompt's 1,364 labels were one 268 MB block of logits on SmolLM2)."""
    n_heads, n_positions = values.z.shape[:2]
    rows = block_rows(projector.vocab, values.z.device)
    per_block = max(1, rows // max(1, n_positions))
    span = max(1, min(n_positions, rows))  # positions a block (all of them unless too many)
    parts = []
    for start in range(0, n_heads, per_block):
        for first in range(0, n_positions, span):
            heads, positions = slice(start, start + per_block), slice(first, first + span)
            logits = values.logits(projector, heads, positions)
            ranks = rank_ids[positions].to(logits.device).expand(logits.shape[0], -1)
            parts.append(
                summarize_logits(logits.reshape(-1, logits.shape[-1]), k, ranks.reshape(-1))
            )
    return concat(parts).reshaped((n_heads, n_positions))


def settled_writes(
    projector: VocabProjector,
    values: Tensor | FactoredValues,
    rows: Tensor,
    base_logits: Tensor,
    target: int,
    labels: list[int],
    margin_ids: tuple[int, int] | None,
) -> SmallWrites | None:
    """The writes a_p · v_p W_O^h whose increases the Taylor expansion settles within its
    tolerance (`analysis.taylor`), where every head's values are factored through its U_h, the
    model has no final soft-cap, and on the CPU (a GPU's products are cheap next to its host's
    work, which the expansion's per-head decisions would add to); None elsewhere (every write
    is projected)."""
    if not isinstance(values, FactoredValues) or projector.softcap is not None:
        return None
    if host_bound(values.z.device):
        return None
    unembeddings = [u for u in values.unembeddings if u is not None]
    if len(unembeddings) != len(values.unembeddings):
        return None
    return small_writes(
        unembeddings=unembeddings,
        x=values.z * projector.final_inv_scale,
        rows=rows,
        base_logits=base_logits,
        target=target,
        labels=labels,
        margin_ids=margin_ids,
    )


@dataclass(frozen=True)
class HeadViews:
    """The tensors of K detailed heads' details, at P label positions, over their nL layers.

    contribution: per-position increases (and label margins) [K, S]; value, weighted: the label
    values' top tokens and label ranks [K, P]; random: those of each layer's comparison head
    [R, P] (None without one); query: W_K^⊤ q [K]; offset: the rotary-aware query views [K, P']
    (None without rotary); key: the normalised layer inputs at the labels [nL, P]; prior: the
    sum of earlier attention outputs there [nL, P]; resid_pre: the layer's raw input at the
    analysed position [nL].
    """

    contribution: Increase
    value: VocabSummary
    weighted: VocabSummary
    random: VocabSummary | None
    query: VocabSummary
    offset: VocabSummary | None
    key: VocabSummary
    prior: VocabSummary
    resid_pre: VocabSummary


def head_views(
    *,
    projector: VocabProjector,
    values: Tensor | FactoredValues,
    rows: Tensor,
    bases: Tensor,
    base_logits: Tensor,
    label_positions: list[int],
    label_ids: Tensor,
    target: int,
    k: int,
    margin_ids: tuple[int, int] | None,
    random_values: Tensor | FactoredValues | None,
    queries: Tensor,
    offsets: Tensor | None,
    keys: Tensor,
    prior: Tensor,
    resid_pre: Tensor,
) -> HeadViews:
    """Per-position increases and the vocabulary views of K heads.

    values [K, S, D]: each head's unweighted values v_p W_O^h (or them factored, fixed mode
    only: `FactoredValues`, projected through each head's U_h); rows [K, S]: its attention from
    the analysed position; bases [K, D] and base_logits [K, V]: resid_pre of its layer there and
    its bs; label_ids [P]: the token at each label position; random_values [R, P, D] (or them
    factored); queries
    [K, D] (W_K^⊤ q); offsets [K, P', D]; keys, prior [nL, P, D]; resid_pre [nL, D].
    """
    n_heads = rows.shape[0]
    label_ranks = label_ids.expand(n_heads, -1)
    batch = ProjectionBatch()
    fixed = None
    if projector.mode == "fixed":  # one projection per value serves all its views
        value_logits = (
            partial(values.logits, projector)
            if isinstance(values, FactoredValues)
            else direct_value_logits(projector, values)
        )
        fixed = position_views_fixed(
            projector,
            bases,
            value_logits,
            rows,
            target,
            label_positions,
            label_ids,
            k,
            margin_ids,
            chunk=values.block_rows() if isinstance(values, FactoredValues) else None,
            base_logits=base_logits,
            small=settled_writes(
                projector, values, rows, base_logits, target, label_positions, margin_ids
            ),
        )
        contribution = fixed.contribution
    else:
        if isinstance(values, FactoredValues):
            raise ValueError("factored values need the fixed norm mode")
        contribution = logprob_increase(
            projector,
            bases,
            subhead_values(rows, values),
            target,
            margin_ids,
            base_logits=base_logits,
        )
        batch.add("value", values[:, label_positions], label_ranks)
        batch.add("weighted", rows[:, label_positions, None] * values[:, label_positions])
    factored_random = None
    if isinstance(random_values, FactoredValues):
        factored_random = summarize_factored(projector, random_values, label_ids, k)
    elif random_values is not None:
        batch.add("random", random_values, label_ids.expand(random_values.shape[0], -1))
    batch.add("query", queries)
    if offsets is not None:
        batch.add("offset", offsets)
    batch.add("key", keys)
    batch.add("prior", prior)
    batch.add("resid_pre", resid_pre)
    views = batch.run(projector, k)
    if factored_random is not None:
        views["random"] = factored_random
    if fixed is not None:
        shape = (n_heads, len(label_positions))
        views["value"] = fixed.value.reshaped(shape)
        views["weighted"] = fixed.weighted.reshaped(shape)
    return HeadViews(
        contribution=contribution,
        value=views["value"],
        weighted=views["weighted"],
        random=views.get("random"),
        query=views["query"],
        offset=views.get("offset"),
        key=views["key"],
        prior=views["prior"],
        resid_pre=views["resid_pre"],
    )
