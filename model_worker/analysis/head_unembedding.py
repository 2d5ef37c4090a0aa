"""Detailed heads' values projected through their factored OV output: fixed-mode bs of
v_p W_O^h is s · (v_p · U_h), with U_h = W_O^h through the final norm's linear part and the
unembedding (s: the frozen final scale), kept in the unembedding's layout [V, d_head].

U_h depends on the model alone, so it can be kept across prompts: a head detailed again costs
S·d_head·V instead of S·D·V multiply-adds per prompt (d_head = D / n_heads); building it
costs d_head rows of the unembedding, about what the direct projection of S ≈ d_head values
costs.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from model_worker.analysis.kernels import unembed_matmul
from model_worker.analysis.metrics import block_rows
from model_worker.analysis.projection import VocabProjector
from model_worker.resources.device_branches import host_bound


def head_unembedding(projector: VocabProjector, w_o_head: Tensor) -> Tensor:
    """U_h of one head's W_O^h [d_head, D] (post-norm scale folded in, as `w_out` gives it):
    the final norm's centring and γ, then the unembedding; no biases. Laid out as the
    unembedding is, [V, d_head], so that z · U_hᵀ goes through the calibrated kernel."""
    normed = projector.norm.center(w_o_head) * projector.norm.weight
    return unembed_matmul(projector.w_u, normed)


_RADII: dict[int, float] = {}


def unembedding_radius(u: Tensor) -> float:
    """max_v ‖U_h[v] − mean row‖ of a kept U_h [V, d] (a bound on its logits' spread: see
    `analysis.taylor`), measured once per tensor (a pass over U_h) and forgotten with it."""
    key = id(u)
    radius = _RADII.get(key)
    if radius is None:
        radius = float((u - u.mean(0)).norm(dim=-1).max())
        _RADII[key] = radius
        weakref.finalize(u, _RADII.pop, key, None)
    return radius


@dataclass(frozen=True)
class FactoredValues:
    """K heads' values, factored: for the heads whose U_h is at hand (`unembeddings`, None for
    the others), their z-space values [K, S, d_head] (v_p of the head's K/V head times the
    layer's frozen post-norm scale), projected through U_h; for the others only (`direct`:
    their indices among the K), their values v_p W_O^h [len(direct), S, D], projected as they
    are. Heads with U_h need no [S, D] values (a 1,022-token prompt's 20 heads: 47 MB)."""

    values: Tensor
    z: Tensor
    unembeddings: Sequence[Tensor | None]

    @property
    def direct(self) -> list[int]:
        """The heads without U_h, whose values are `values` (in this order)."""
        return [i for i, u in enumerate(self.unembeddings) if u is None]

    def logits(self, projector: VocabProjector, heads: slice, positions: slice | Tensor) -> Tensor:
        """Fixed-mode bs of the values of `heads` at `positions` (a slice or an index tensor)
        → [b, m, V] (= projector.linear of them)."""
        chosen = range(len(self.unembeddings))[heads]
        row = {h: r for r, h in enumerate(self.direct)}  # a direct head's row of `values`
        direct = [i for i, h in enumerate(chosen) if h in row]
        if len(direct) == len(chosen):  # consecutive heads, all direct: consecutive rows
            first = row[chosen[0]]
            return projector.linear(self.values[first : first + len(chosen), positions])
        z = self.z[heads, positions] * projector.final_inv_scale
        if len(chosen) == 1:  # one factored head: its product is the block, no copy
            unembedding = self.unembeddings[chosen[0]]
            assert unembedding is not None
            return unembed_matmul(z[0], unembedding)[None]
        out = z.new_empty(*z.shape[:2], projector.vocab)
        if direct:
            rows = [row[chosen[i]] for i in direct]
            out[direct] = projector.linear(self.values[:, positions][rows])
        for i, h in enumerate(chosen):
            unembedding = self.unembeddings[h]
            if unembedding is not None:
                out[i] = unembed_matmul(z[i], unembedding)
        return out

    def block_rows(self) -> int | None:
        """Rows per block of logits: on the CPU, one head's positions where every head has its
        U_h (each block is then one product, kept as it comes), at most a default block's rows
        (a long prompt's 1,022 positions made a 201 MB block on SmolLM2), else None (the
        default blocks). On a GPU always None: several heads a block, each head's product
        copied in, so that every pass over a block (the increases' log-softmax, the label
        tables' top-k and ranks) is one launch for all its heads, not one a head."""
        first = self.unembeddings[0] if self.unembeddings else None
        if host_bound(self.z.device):
            return None
        if first is None or any(u is None for u in self.unembeddings):
            return None
        return max(1, min(self.z.shape[1], block_rows(first.shape[0], self.z.device)))
