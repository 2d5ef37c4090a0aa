"""Increases of small writes without projecting them: the log-probability's Taylor expansion,
used only where a proved bound keeps its error under TOLERANCE.

For a write w = a · x on a base with logits b (fixed mode, no soft-cap), the logits of base + w
are b + a · L with L = x · U_hᵀ, and with p = softmax(b):

    I(a) = a · L_t − K(a),   K(a) = log E_p[exp(a · L)]   (the tilted log-partition)

K(0) = 0, K'(0) = μ = E_p[L], K''(0) = σ² = Var_p(L), and every derivative of K is a central
moment of some tilted distribution of L, whose values span R = max L − min L. So
(Popoviciu: a variance ≤ R² / 4; a third central moment ≤ R · R² / 4):

    0 ≤ K(a) − a μ ≤ a² R² / 8                      (first order)
    |K(a) − a μ − a² σ² / 2| ≤ |a|³ R³ / 24          (second order)

μ = x · (U_hᵀ p) and σ² = x C xᵀ with C = (U_h − U_hᵀp)ᵀ diag(p) (U_h − U_hᵀp) need no
vocabulary product per write (C is d_head × d_head, one Gram product per head), and
R ≤ 2 ‖x‖ max_v ‖U_h[v] − c‖ for any centre c (Cauchy–Schwarz). A write whose bound is within
TOLERANCE takes the expansion; the others are projected and log-softmaxed exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from model_worker.analysis.head_unembedding import unembedding_radius

#: Largest error an increase taken from the expansion may carry (proved bound): ten times
#: below the fp32 rounding of an exact increase (the difference of two log-softmaxes over the
#: vocabulary, ~1e-6 on SmolLM2), so the numbers stay as close to float64's as before.
TOLERANCE = 1e-7


@dataclass(frozen=True)
class SmallWrites:
    """Increases [K, S] (and label margins) of the writes whose bound allowed the expansion
    (`done` [K, S], bool); the other entries are to be computed exactly."""

    done: Tensor
    increase: Tensor
    margin: Tensor | None


def centred_gram(u: Tensor, mean: Tensor, p: Tensor) -> Tensor:
    """C = (U_h − U_hᵀp)ᵀ diag(p) (U_h − U_hᵀp) [d, d] of U_h [V, d], `mean` = U_hᵀp [d] and
    p [V]: the one product over the vocabulary (V · d² multiply-adds) that a head's second
    order needs."""
    centred = (u - mean).mul_(p.sqrt()[:, None])
    return centred.T @ centred


def small_writes(
    *,
    unembeddings: Sequence[Tensor],
    x: Tensor,
    rows: Tensor,
    base_logits: Tensor,
    target: int,
    labels: list[int],
    margin_ids: tuple[int, int] | None = None,
    tolerance: float = TOLERANCE,
) -> SmallWrites:
    """The expansion's increases of K heads' writes a_p · x_p: U_h [V, d] per head, x [K, S, d]
    (so that x_p · U_hᵀ is the write's logits), rows [K, S] (a_p), base_logits [K, V] (no
    soft-cap). Only writes not at `labels` (whose logits are projected anyway) count: a head
    takes the expansion where it settles at least d / 4 of them (its sums read U_h once: ~a
    dozen writes' products and log-softmaxes), counting the second order's only where C is
    computed, which is where the second order settles at least d more than the first (C and
    its centring cost ~40–70 writes' on a CPU, d = 64)."""
    n_heads, n_positions, d = x.shape
    done = torch.zeros(n_heads, n_positions, dtype=torch.bool, device=x.device)
    increase = x.new_zeros(n_heads, n_positions)
    margin = None if margin_ids is None else x.new_zeros(n_heads, n_positions)
    projected = torch.zeros(n_positions, dtype=torch.bool, device=x.device)
    projected[labels] = True
    radius = torch.tensor([unembedding_radius(u) for u in unembeddings], device=x.device)
    spread = rows * 2 * x.norm(dim=-1) * radius[:, None]  # a · R (bound), [K, S]
    first_order = spread.square() / 8 <= tolerance
    second_order = spread.pow(3) / 24 <= tolerance
    free = ~projected
    first_count, more = torch.stack(
        [(first_order & free).sum(-1), (second_order & ~first_order & free).sum(-1)]
    ).tolist()  # per head: writes the first order settles, and how many more only with C
    for h, u in enumerate(unembeddings):
        with_variance = more[h] >= d  # C repays itself
        if first_count[h] + (more[h] if with_variance else 0) < d / 4:  # too few to repay
            continue  # the head's sums
        xs, a = x[h], rows[h]
        p = torch.softmax(base_logits[h], -1)
        mean = p @ u  # U_hᵀ p: μ = x · mean
        first, settled = a * (xs @ (u[target] - mean)), first_order[h]
        if with_variance:
            variance = ((xs @ centred_gram(u, mean, p)) * xs).sum(-1)
            first, settled = first - a.square() * variance / 2, second_order[h]
        done[h], increase[h] = settled, torch.where(settled, first, 0.0)
        if margin is not None and margin_ids is not None:
            margin[h] = a * (xs @ (u[margin_ids[0]] - u[margin_ids[1]]))
    return SmallWrites(done, increase, margin)
