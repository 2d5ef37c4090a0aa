"""Information flow per layer from the attention weights (paper Fig. 1a; Wang et al. 2023,
"Label words are anchors"), averaged over heads.

With A the layer's attention pattern averaged over heads (rows = destinations, each summing to
1 over its causal sources), the causal (destination, source) pairs split into three sets:
- demonstration → label: (t_i, p) for every token p of demonstration i before its label
  position t_i (from the token after the previous label position);
- label → last: (last, t_i) for every label position;
- other: every remaining pair with source ≤ destination.
Each set's flow is the mean weight over its pairs (Wang et al.'s S_wp, S_pq, S_ww); its mass is
the summed weight, and the three masses add up to the number of rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

FLOWS = ("demo_to_label", "label_to_last", "other")


def flow_masks(n: int, labels: Sequence[int]) -> dict[str, Tensor]:
    """The three [n, n] boolean pair sets of a prompt of n tokens (last position n − 1)."""
    demo = torch.zeros(n, n, dtype=torch.bool)
    start = 0
    for position in labels:
        demo[position, start:position] = True
        start = position + 1
    last = torch.zeros(n, n, dtype=torch.bool)
    last[n - 1, list(labels)] = True
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return {"demo_to_label": demo, "label_to_last": last, "other": causal & ~demo & ~last}


@dataclass(frozen=True)
class Flow:
    """Per layer [L]: the mean weight and the mass of each flow in FLOWS, and pair counts."""

    mean: dict[str, Tensor]
    mass: dict[str, Tensor]
    pairs: dict[str, int]


def information_flow(pattern: Tensor, labels: Sequence[int]) -> Flow:
    """Flows of one prompt: pattern [L, H, n, n] (its real tokens only), label positions."""
    averaged = pattern.float().mean(1).cpu()  # [L, n, n]
    masks = flow_masks(averaged.shape[-1], labels)
    mass = {name: (averaged * mask).sum((-1, -2)) for name, mask in masks.items()}
    pairs = {name: int(mask.sum()) for name, mask in masks.items()}
    mean = {name: mass[name] / max(1, pairs[name]) for name in masks}
    return Flow(mean, mass, pairs)
