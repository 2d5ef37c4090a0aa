"""`bs(v)`: residual-space vectors → vocabulary logits through the final norm and unembedding.

Two norm modes (DESIGN.md):
- `fixed`: the final norm's scale is frozen at the analysed position's real final residual, so
  `bs(base + v) = bs(base) + bs_linear(v)`; biases (β, b_U) come only with the base.
- `recompute`: the model's real final norm is applied to `base + v`.
A final-logit soft-cap (Gemma 2) is not part of bs: `cap()` applies it to summed logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model_worker.analysis.kernels import unembed_matmul
from model_worker.contracts.common import NormKind, NormMode


@dataclass(frozen=True)
class FinalNorm:
    """The model's final norm as plain tensors: γ [D], β [D] or None, eps."""

    kind: NormKind
    weight: Tensor
    bias: Tensor | None
    eps: float

    def center(self, x: Tensor) -> Tensor:
        """LayerNorm subtracts the mean; RMSNorm does not."""
        return x - x.mean(-1, keepdim=True) if self.kind == "layer" else x

    def inv_scale(self, x: Tensor) -> Tensor:
        """1 / rms(x) or 1 / std(x) over the last axis, keepdim, eps included as the model does."""
        centred = self.center(x)
        return torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps)

    def __call__(self, x: Tensor) -> Tensor:
        """The real norm of `x` [..., D]."""
        out = self.center(x) * self.inv_scale(x) * self.weight
        return out if self.bias is None else out + self.bias


@dataclass(frozen=True)
class VocabProjector:
    """Projects residual vectors of one analysed position onto the vocabulary.

    `w_u` [V, D], `b_u` [V] or None; `final_inv_scale` is 1/scale of the real final residual
    (a 0-d tensor), used by the `fixed` mode; `softcap` c of a final-logit soft-cap, or None.
    """

    norm: FinalNorm
    w_u: Tensor
    b_u: Tensor | None
    mode: NormMode
    final_inv_scale: Tensor
    softcap: float | None = None

    @classmethod
    def at(
        cls,
        norm: FinalNorm,
        w_u: Tensor,
        b_u: Tensor | None,
        mode: NormMode,
        x_final: Tensor,
        softcap: float | None = None,
    ) -> VocabProjector:
        """A projector whose fixed scale is that of the final pre-norm residual `x_final` [D]."""
        return cls(norm, w_u, b_u, mode, norm.inv_scale(x_final).squeeze(-1), softcap)

    def cap(self, logits: Tensor) -> Tensor:
        """The model's final logits from summed bs logits: c·tanh(z / c), or z without a cap.
        Works in place on `logits` (callers pass scratch or a fresh sum)."""
        if self.softcap is None:
            return logits
        return logits.div_(self.softcap).tanh_().mul_(self.softcap)

    @property
    def vocab(self) -> int:
        """The vocabulary size V."""
        return int(self.w_u.shape[0])

    def _unembed(self, normed: Tensor, with_bias: bool) -> Tensor:
        """normed [..., D] → logits [..., V]."""
        flat = normed.reshape(-1, normed.shape[-1])
        logits = unembed_matmul(flat, self.w_u, kept=True).view(*normed.shape[:-1], -1)
        return logits.add_(self.b_u) if with_bias and self.b_u is not None else logits

    def linear(self, v: Tensor) -> Tensor:
        """Fixed-mode bs of a component `v` [..., D] → [..., V]: no biases, frozen scale."""
        normed = self.norm.center(v) * self.final_inv_scale * self.norm.weight
        return self._unembed(normed, False)

    def logits(self, x: Tensor) -> Tensor:
        """bs of a base (a whole residual) `x` [..., D] → [..., V], biases included."""
        if self.mode == "recompute":
            return self._unembed(self.norm(x), True)
        beta = self.norm.bias
        normed = self.norm.center(x) * self.final_inv_scale * self.norm.weight
        return self._unembed(normed if beta is None else normed + beta, True)

    def project(self, v: Tensor) -> Tensor:
        """Vocabulary view of a standalone vector `v` [..., D] (top-token tables, ranks)."""
        return self.linear(v) if self.mode == "fixed" else self.logits(v)

    def delta(self, base_logits: Tensor, bases: Tensor, vectors: Tensor) -> Tensor:
        """bs(base + v) − bs(base) for `vectors` [B, M, D] on `bases` [B, D] → [B, M, V]."""
        if self.mode == "fixed":
            return self.linear(vectors)
        return self.logits(bases[:, None, :] + vectors).sub_(base_logits[:, None, :])
