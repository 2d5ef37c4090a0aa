"""The per-head stage of an analysis: layer, head and label increases at the analysed position.

Pure tensor maths on captured activations (one prompt, its last position): what the layer
chart, the heatmap and the top-heads table need (paper Fig. 2–4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from model_worker.analysis.contributions import (
    base_logprobs,
    head_outputs,
    logprob_increase,
    positions_z,
    split_increase,
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
    resid_pre again."""
    if projector.mode == "fixed":  # bs is linear: bs(resid_mid) = bs(resid_pre) + bs(attn_out)
        if pre_logits is None:
            pre_logits = projector.logits(resid_pre)
        mid_logits = projector.linear(attn_out).add_(pre_logits)
        attn = base_logprobs(projector, mid_logits, target)
        attn -= base_logprobs(projector, pre_logits, target)
        ffn = logprob_increase(
            projector, resid_pre + attn_out, mlp_out[:, None], target, base_logits=mid_logits
        )
        return attn, ffn.increase[:, 0]
    attn = logprob_increase(
        projector, resid_pre, attn_out[:, None], target, base_logits=pre_logits
    ).increase[:, 0]
    ffn = logprob_increase(projector, resid_pre + attn_out, mlp_out[:, None], target)
    return attn, ffn.increase[:, 0]


@dataclass(frozen=True)
class HeadIncreases:
    """[L, H] each: I(head | resid_pre) (paper Fig. 3/4), and the same I of the head restricted
    to the label positions (`label`) and to every other position (`other`)."""

    total: Tensor
    label: Tensor
    other: Tensor


def head_increases(
    *,
    projector: VocabProjector,
    resid_pre: Tensor,
    z: Tensor,
    v: Tensor,
    pattern_row: Tensor,
    attn_scale: Tensor,
    w_o: Sequence[Tensor],
    kv_index: Tensor,
    label_positions: list[int],
    target: int,
    pre_logits: Tensor | None = None,
) -> HeadIncreases:
    """Every head's increase, whole and split into its label positions and the rest.

    resid_pre [L, D], z [L, H*d_head] and attn_scale [L, 1] at the analysed position, v
    [L, S, n_kv, d_head], pattern_row [L, H, S] (the analysed position's attention), w_o per
    layer [H, d_head, D], kv_index [H] (query head → its K/V head).
    """
    heads, label_parts = [], []
    for layer, layer_w_o in enumerate(w_o):
        z_label = positions_z(v[layer], pattern_row[layer], kv_index, label_positions)
        z_label = z_label * attn_scale[layer]  # the post-norm scale, frozen as in z
        both = head_outputs(torch.stack([z[layer], z_label]), layer_w_o)  # [2, H, D]
        heads.append(both[0])
        label_parts.append(both[1])
    total, label, other = split_increase(
        projector,
        resid_pre,
        torch.stack(heads),
        torch.stack(label_parts),
        target,
        base_logits=pre_logits,
    )
    return HeadIncreases(total, label, other)


def attention_sums(
    *, pattern_row: Tensor, true_positions: list[int], false_positions: list[int]
) -> tuple[Tensor, Tensor]:
    """Attention of the analysed position (pattern_row [L, H, S]) on the true and on the false
    labels: two [L, H]."""
    return pattern_row[..., true_positions].sum(-1), pattern_row[..., false_positions].sum(-1)
