"""Information flow without the attention sink, for attention or for saliency.

The first token of a prompt collects a large share of every row's attention whatever it says
(the attention *sink*); counted in demonstration 1, it dominates the demonstration → label
pairs of the first label. Here the three pair sets of model_worker.analysis.flow (demonstration
→ label, labels → last token, other) drop every pair whose source is token 0, and the sink's
share is reported apart:
- `sink_demo_to_label`: the share of the demonstration → label mass (with token 0) that falls
  on token 0;
- `sink_last`: the share of the last token's row that falls on token 0.

The matrix may be the head-averaged attention pattern, or Wang et al.'s saliency
I_l = |Σ_h A_h ⊙ ∂L/∂A_h| (the attention weighted by the gradient of the loss; what their
S_wp, S_pq, S_ww average): attention says where a row reads, saliency how much that reading
changes the loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from model_worker.analysis.flow import FLOWS, flow_masks

#: the per-layer columns `sinkless_flow` returns, in order
COLUMNS = (*FLOWS, "sink_demo_to_label", "sink_last")


def sinkless_flow(matrix: Tensor, labels: Sequence[int]) -> Tensor:
    """[5, L]: the mean over each pair set without token 0 as a source (FLOWS order), then the
    sink shares, of `matrix` [L, n, n] (one prompt's real tokens, rows = destinations)."""
    layers, n = matrix.shape[0], matrix.shape[-1]
    masks = flow_masks(n, labels)
    values = matrix.float().cpu()
    out = torch.zeros(len(COLUMNS), layers)
    for i, name in enumerate(FLOWS):
        mask = masks[name].clone()
        mask[:, 0] = False
        pairs = int(mask.sum())
        out[i] = (values * mask).sum((-1, -2)) / max(1, pairs)
    demo = masks["demo_to_label"]
    demo_mass = (values * demo).sum((-1, -2))
    sink_mass = (values[:, :, 0] * demo[:, 0]).sum(-1)
    out[3] = torch.where(demo_mass > 0, sink_mass / demo_mass.clamp_min(1e-30), 0.0)
    last_row = values[:, n - 1, :]
    row_mass = last_row.sum(-1)
    out[4] = torch.where(row_mass > 0, last_row[:, 0] / row_mass.clamp_min(1e-30), 0.0)
    return out
