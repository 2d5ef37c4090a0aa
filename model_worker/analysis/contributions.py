"""Per-head outputs, subheadvalues, and their log-probability increases (paper Fig. 2–4, 7)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model_worker.analysis.projection import VocabProjector


def head_outputs(z: Tensor, w_o: Tensor) -> Tensor:
    """Each head's write into the residual: z [..., H*d_head], W_O [H, d_head, D] → [..., H, D].

    Their sum plus the output bias is the attention output.
    """
    n_heads, d_head, _ = w_o.shape
    z_heads = z.reshape(*z.shape[:-1], n_heads, d_head)
    return torch.einsum("...hd,hdm->...hm", z_heads, w_o)


def value_outputs(v: Tensor, w_o: Tensor, kv_index: Tensor) -> Tensor:
    """Unweighted label values v_p W_O^h for every source position.

    v [S, n_kv, d_head], W_O [H, d_head, D], kv_index [H] (query head → its K/V head)
    → [H, S, D].
    """
    return torch.einsum("shd,hdm->hsm", v[:, kv_index, :], w_o)


def subhead_values(pattern_row: Tensor, values: Tensor) -> Tensor:
    """a_{h,p} · v_p W_O^h: pattern_row [H, S] (last query row), values [H, S, D] → [H, S, D].

    Summed over positions this is the head's output at the analysed position.
    """
    return pattern_row[..., None] * values


@dataclass(frozen=True)
class Increase:
    """Log-probability increases [B, M], and the label margin [B, M] when asked for."""

    increase: Tensor
    margin: Tensor | None


def logprob_increase(
    projector: VocabProjector,
    bases: Tensor,
    vectors: Tensor,
    target: int,
    margin_ids: tuple[int, int] | None = None,
    chunk: int = 256,
) -> Increase:
    """I(v | x) = log softmax(bs(x + v))[target] − log softmax(bs(x))[target].

    `bases` [B, D] each carry `vectors` [B, M, D]; returns [B, M]. With `margin_ids` (a, b) also
    the margin (bs(x + v) − bs(x))[a] − (…)[b]. Vectors are projected `chunk` at a time.
    """
    base_logits = projector.logits(bases)  # [B, V]
    base_logprob = torch.log_softmax(base_logits, -1)[:, target]  # [B]
    n_bases, n_vectors = vectors.shape[:2]
    rows = max(1, chunk // max(1, n_vectors))
    increases, margins = [], []
    for start in range(0, n_bases, rows):
        part = slice(start, start + rows)
        delta = projector.delta(base_logits[part], bases[part], vectors[part])  # [b, M, V]
        full = base_logits[part, None, :] + delta
        logprob = full[..., target] - torch.logsumexp(full, -1)
        increases.append(logprob - base_logprob[part, None])
        if margin_ids is not None:
            margins.append(delta[..., margin_ids[0]] - delta[..., margin_ids[1]])
    return Increase(torch.cat(increases), torch.cat(margins) if margin_ids is not None else None)
