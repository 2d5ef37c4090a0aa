"""Per-head outputs, subheadvalues, and their log-probability increases (paper Fig. 2–4, 7)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model_worker.analysis.metrics import CHUNK, VocabSummary, concat, summarize_logits
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


def _increase(
    base_logits: Tensor, delta: Tensor, target: int, margin_ids: tuple[int, int] | None
) -> tuple[Tensor, Tensor | None]:
    """Increase [b, M] (and margin) of `delta` [b, M, V] on `base_logits` [b, V].

    `delta` is consumed: it becomes the full logits in place (it can be hundreds of MB).
    """
    margin = None if margin_ids is None else delta[..., margin_ids[0]] - delta[..., margin_ids[1]]
    full = delta.add_(base_logits[:, None, :])
    logprob = full[..., target] - torch.logsumexp(full, -1)
    base = base_logits[:, target] - torch.logsumexp(base_logits, -1)
    return logprob - base[:, None], margin


def _chunks(n_bases: int, n_vectors: int, chunk: int) -> list[slice]:
    rows = max(1, chunk // max(1, n_vectors))
    return [slice(start, start + rows) for start in range(0, n_bases, rows)]


def _join(parts: list[tuple[Tensor, Tensor | None]]) -> Increase:
    margins = [m for _, m in parts if m is not None]
    return Increase(torch.cat([i for i, _ in parts]), torch.cat(margins) if margins else None)


def logprob_increase(
    projector: VocabProjector,
    bases: Tensor,
    vectors: Tensor,
    target: int,
    margin_ids: tuple[int, int] | None = None,
    chunk: int = CHUNK,
    base_logits: Tensor | None = None,
) -> Increase:
    """I(v | x) = log softmax(bs(x + v))[target] − log softmax(bs(x))[target].

    `bases` [B, D] each carry `vectors` [B, M, D]; returns [B, M]. With `margin_ids` (a, b) also
    the margin (bs(x + v) − bs(x))[a] − (…)[b]. Vectors are projected `chunk` at a time;
    `base_logits` [B, V], when the caller has them, spare projecting the bases again.
    """
    if base_logits is None:
        base_logits = projector.logits(bases)
    return _join(
        [
            _increase(
                base_logits[part],
                projector.delta(base_logits[part], bases[part], vectors[part]),
                target,
                margin_ids,
            )
            for part in _chunks(vectors.shape[0], vectors.shape[1], chunk)
        ]
    )


@dataclass(frozen=True)
class PositionViews:
    """Per-position contributions [K, S] of K heads, and the vocabulary views of their
    values at chosen positions, unweighted and attention-weighted ([K, P] summaries)."""

    contribution: Increase
    value: VocabSummary
    weighted: VocabSummary


def position_views_fixed(
    projector: VocabProjector,
    bases: Tensor,
    values: Tensor,
    rows: Tensor,
    target: int,
    positions: list[int],
    rank_ids: Tensor,
    k: int,
    margin_ids: tuple[int, int] | None = None,
    chunk: int = CHUNK,
    base_logits: Tensor | None = None,
) -> PositionViews:
    """Fixed mode only: bs is linear, so one projection L = bs(v_p W_O^h) of each value serves
    both its subheadvalue (a_p · L) and the label tables at `positions`.

    bases [K, D], values [K, S, D], rows [K, S] (attention of the last position),
    rank_ids [P] (the token to rank at each kept position).
    """
    if projector.mode != "fixed":
        raise ValueError("position_views_fixed needs the fixed norm mode")
    if base_logits is None:
        base_logits = projector.logits(bases)
    parts, plain, weighted = [], [], []
    for part in _chunks(values.shape[0], values.shape[1], chunk):
        value_logits = projector.linear(values[part])  # [b, S, V]
        weights = rows[part, :, None]
        kept = value_logits[:, positions]  # [b, P, V], a copy
        parts.append(_increase(base_logits[part], value_logits.mul_(weights), target, margin_ids))
        n, p, vocab = kept.shape
        ranks = rank_ids.expand(n, -1).reshape(-1)
        summary = summarize_logits(kept.reshape(n * p, vocab), k, ranks)
        plain.append(summary)
        # a_p ≥ 0 scales a row without reordering it: the same tokens, values times a_p
        scale = weights[:, positions, 0].reshape(n * p, 1)
        weighted.append(VocabSummary(summary.top_ids, summary.top_values * scale, summary.ranks))
    return PositionViews(_join(parts), concat(plain), concat(weighted))
