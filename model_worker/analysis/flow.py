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

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from model_worker.resources.device_index import index_on

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


def pair_counts(n: int, labels: Sequence[int]) -> dict[str, int]:
    """How many (destination, source) pairs each flow of FLOWS has in a prompt of n tokens."""
    demo, start = 0, 0
    for position in labels:
        demo += position - start
        start = position + 1
    last = len(set(labels))
    return {"demo_to_label": demo, "label_to_last": last, "other": n * (n + 1) // 2 - demo - last}


def layer_masses(averaged: Tensor, labels: Sequence[int]) -> Tensor:
    """The masses [3] (FLOWS order) of one layer's head-averaged causal pattern [n, n] (zero
    above the diagonal), without building the [n, n] pair sets: what a capture keeps per layer
    instead of the pattern."""
    n = averaged.shape[-1]
    if not labels:
        total = averaged.sum()
        return torch.stack([total * 0, total * 0, total])
    positions, own, sources = demonstration_sources(tuple(labels), n, averaged.device)
    demo = (averaged[positions] * own).sum()
    last = averaged[n - 1, sources].sum()
    return torch.stack([demo, last, averaged.sum() - demo - last])


@functools.lru_cache(maxsize=64)
def demonstration_sources(
    labels: tuple[int, ...], n: int, device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """On `device`, made once per prompt (every layer of a capture reads them; no stream sync
    a layer, see model_worker.resources.device_index): the label positions [P], which sources each
    label reads from its demonstration [P, n] (bool: from the token after the previous label up to
    the label, excluded), and the distinct label positions, sorted."""
    positions = index_on(labels, device)
    starts = index_on([0, *(p + 1 for p in labels[:-1])], device)
    columns = torch.arange(n, device=device)
    own = (columns >= starts[:, None]) & (columns < positions[:, None])  # [P, n]
    return positions, own, index_on(sorted(set(labels)), device)


@dataclass(frozen=True)
class Flow:
    """Per layer [L]: the mean weight and the mass of each flow in FLOWS, and pair counts."""

    mean: dict[str, Tensor]
    mass: dict[str, Tensor]
    pairs: dict[str, int]


def flow_of(masses: Tensor, n: int, labels: Sequence[int]) -> Flow:
    """The Flow of per-layer masses [L, 3] (`layer_masses`) of a prompt of n tokens."""
    pairs = pair_counts(n, labels)
    mass = {name: masses[:, i].float().cpu() for i, name in enumerate(FLOWS)}
    mean = {name: mass[name] / max(1, pairs[name]) for name in FLOWS}
    return Flow(mean, mass, pairs)


def information_flow(pattern: Tensor, labels: Sequence[int]) -> Flow:
    """Flows of one prompt: pattern [L, H, n, n] (its real tokens only), label positions."""
    masses = torch.stack([layer_masses(layer.float().mean(0), labels) for layer in pattern])
    return flow_of(masses, pattern.shape[-1], labels)
