"""The per-head stage of an analysis: layer and head increases at the analysed position, and
the heads' split into label positions and the rest.

Pure tensor maths on captured activations (one prompt, its last position): what the layer
chart, the heatmap and the top-heads table need (paper Fig. 2–4). The split costs as much as
the head increases; it is computed with them when it ranks the heads, else after them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from model_worker.analysis.contributions import (
    WholeIncrease,
    base_logprobs,
    head_outputs,
    logprob_increase,
    part_increases,
    positions_z,
    whole_increase,
)
from model_worker.analysis.projection import VocabProjector


def layer_increase_table(
    *,
    projector: VocabProjector,
    resid_pre: Tensor,
    attn_out: Tensor,
    mlp_out: Tensor,
    target: int,
    pre_logits: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """I(attn_l | resid_pre_l) and I(ffn_l | resid_mid_l) [L] each, from resid_pre, attn_out
    and mlp_out [L, D] at one position; `pre_logits` [L, V], when known, spare projecting
    resid_pre again.

    In fixed mode bs is linear and resid_mid_l + mlp_out_l is resid_pre_{l+1} (the residual
    bookkeeping), so an FFN's increase is log p(resid_pre_{l+1}) − log p(resid_mid_l): one
    projection per layer for the attention, one for the last FFN, none for the others."""
    if projector.mode == "fixed":
        if pre_logits is None:
            pre_logits = projector.logits(resid_pre)
        pre = base_logprobs(projector, pre_logits, target)
        mid = base_logprobs(projector, projector.linear(attn_out).add_(pre_logits), target)
        last_post = projector.logits(resid_pre[-1:] + attn_out[-1:] + mlp_out[-1:])
        post = torch.cat([pre[1:], base_logprobs(projector, last_post, target)])
        return mid - pre, post - mid
    attn = logprob_increase(
        projector, resid_pre, attn_out[:, None], target, base_logits=pre_logits
    ).increase[:, 0]
    ffn = logprob_increase(projector, resid_pre + attn_out, mlp_out[:, None], target)
    return attn, ffn.increase[:, 0]


@dataclass(frozen=True)
class HeadWrites:
    """[L, H, D] each, at the analysed position: every head's write into the residual
    (`whole`) and the part of it that its label positions write (`label`)."""

    whole: Tensor
    label: Tensor


def head_writes(
    *,
    z: Tensor,
    v: Tensor,
    pattern_row: Tensor,
    attn_scale: Tensor,
    w_o: Iterable[Tensor],
    kv_index: Tensor,
    label_positions: list[int],
) -> HeadWrites:
    """Every head's write and its label positions' part of it.

    z [L, H*d_head] and attn_scale [L, 1] at the analysed position, v [L, S, n_kv, d_head],
    pattern_row [L, H, S] (the analysed position's attention), w_o per layer [H, d_head, D]
    (read one at a time: a bf16 model's fp32 copies need not all exist at once), kv_index [H]
    (query head → its K/V head).
    """
    z_label = positions_z(v, pattern_row, kv_index, label_positions)  # every layer's at once
    z_label = z_label * attn_scale  # the post-norm scale, frozen as in z
    both = torch.stack([z, z_label], 1)  # [L, 2, H*d_head]
    writes = torch.stack([head_outputs(both[layer], w) for layer, w in enumerate(w_o)], 1)
    return HeadWrites(writes[0], writes[1])  # [L, H, D] each, contiguous


@dataclass(frozen=True)
class LabelSplit:
    """[L, H] each: I of every head restricted to its label positions (`label`) and to every
    other position (`other`)."""

    label: Tensor
    other: Tensor


def head_increases(
    *,
    projector: VocabProjector,
    resid_pre: Tensor,
    writes: HeadWrites,
    target: int,
    pre_logits: Tensor | None = None,
) -> WholeIncrease:
    """I(head | resid_pre) [L, H] of every head (paper Fig. 3/4), resid_pre [L, D] at the
    analysed position; its logits kept (fixed mode) for one `label_split`, which consumes them."""
    return whole_increase(projector, resid_pre, writes.whole, target, base_logits=pre_logits)


def label_split(
    *,
    projector: VocabProjector,
    resid_pre: Tensor,
    writes: HeadWrites,
    whole: WholeIncrease,
    target: int,
    pre_logits: Tensor | None = None,
) -> LabelSplit:
    """Every head's increase split into its label positions and the rest."""
    label, other = part_increases(
        projector,
        resid_pre,
        writes.whole,
        writes.label,
        target,
        base_logits=pre_logits,
        whole_logits=whole.logits,
    )
    return LabelSplit(label, other)


def attention_sums(
    *, pattern_row: Tensor, true_positions: list[int], false_positions: list[int]
) -> tuple[Tensor, Tensor]:
    """Attention of the analysed position (pattern_row [L, H, S]) on the true and on the false
    labels: two [L, H]."""
    return pattern_row[..., true_positions].sum(-1), pattern_row[..., false_positions].sum(-1)
