"""Per-head outputs, subheadvalues, and their log-probability increases (paper Fig. 2–4, 7)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model_worker.analysis.metrics import VocabSummary, block_rows, logsumexp_, summarize_logits
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
    projector: VocabProjector,
    base_logits: Tensor,
    delta: Tensor,
    target: int,
    margin_ids: tuple[int, int] | None,
) -> tuple[Tensor, Tensor | None]:
    """Increase [b, M] (and margin) of `delta` [b, M, V] on `base_logits` [b, V], with any
    final soft-cap applied to the summed logits.

    `delta` (a whole block of logits) is consumed as scratch.
    """
    margin = None if margin_ids is None else delta[..., margin_ids[0]] - delta[..., margin_ids[1]]
    full = projector.cap(delta.add_(base_logits[:, None, :]))
    logprob = full[..., target].clone() - logsumexp_(full)  # a copy: full becomes scratch
    base_full = base_logits if projector.softcap is None else projector.cap(base_logits.clone())
    base = base_full[:, target] - torch.logsumexp(base_full, -1)
    return logprob - base[:, None], margin


def _blocks(n_bases: int, n_vectors: int, rows: int) -> list[tuple[slice, slice]]:
    """(bases, vectors) slices of about `rows` vectors each: several bases per block when
    they carry few vectors, several blocks per base when one base carries more."""
    if n_vectors >= rows:
        return [
            (slice(b, b + 1), slice(m, m + rows))
            for b in range(n_bases)
            for m in range(0, n_vectors, rows)
        ]
    per_block = max(1, rows // max(1, n_vectors))
    return [(slice(b, b + per_block), slice(None)) for b in range(0, n_bases, per_block)]


def logprob_increase(
    projector: VocabProjector,
    bases: Tensor,
    vectors: Tensor,
    target: int,
    margin_ids: tuple[int, int] | None = None,
    chunk: int | None = None,
    base_logits: Tensor | None = None,
) -> Increase:
    """I(v | x) = log softmax(bs(x + v))[target] − log softmax(bs(x))[target].

    `bases` [B, D] each carry `vectors` [B, M, D]; returns [B, M]. With `margin_ids` (a, b) also
    the margin (bs(x + v) − bs(x))[a] − (…)[b]. Vectors are projected about `chunk` at a time
    (by default a block that fits `block_rows`); `base_logits` [B, V], when the caller has
    them, spare projecting the bases again.
    """
    if base_logits is None:
        base_logits = projector.logits(bases)
    rows = chunk or block_rows(projector.vocab, vectors.device)
    increase = vectors.new_empty(vectors.shape[:2])
    margin = None if margin_ids is None else vectors.new_empty(vectors.shape[:2])
    for b, m in _blocks(vectors.shape[0], vectors.shape[1], rows):
        delta = projector.delta(base_logits[b], bases[b], vectors[b, m])
        increase[b, m], block_margin = _increase(
            projector, base_logits[b], delta, target, margin_ids
        )
        if margin is not None and block_margin is not None:
            margin[b, m] = block_margin
    return Increase(increase, margin)


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
    chunk: int | None = None,
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
    n_heads, n_positions = values.shape[:2]
    increase = values.new_empty(n_heads, n_positions)
    margin = None if margin_ids is None else values.new_empty(n_heads, n_positions)
    width = min(k, projector.vocab)
    top_ids = torch.zeros(n_heads, len(positions), width, dtype=torch.long, device=values.device)
    top_values = values.new_zeros(n_heads, len(positions), width)
    ranks = torch.zeros(n_heads, len(positions), dtype=torch.long, device=values.device)
    block = chunk or block_rows(projector.vocab, values.device)
    for b, m in _blocks(n_heads, n_positions, block):
        value_logits = projector.linear(values[b, m])  # [b, m, V]
        span = range(n_positions)[m]
        kept = [(n, p - span.start) for n, p in enumerate(positions) if p in span]
        if kept:  # the label tables, from a compact copy made before the values are weighted
            index = [n for n, _ in kept]
            chosen = value_logits[:, [p for _, p in kept]]  # [b, P', V]
            shape = chosen.shape[:2]
            summary = summarize_logits(
                chosen.reshape(-1, chosen.shape[-1]), k, rank_ids[index].expand(shape).reshape(-1)
            )
            top_ids[b, index] = summary.top_ids.reshape(*shape, -1)
            top_values[b, index] = summary.top_values.reshape(*shape, -1)
            ranks[b, index] = summary.ranks.reshape(shape)
        weighted = value_logits.mul_(rows[b, m, None])
        increase[b, m], block_margin = _increase(
            projector, base_logits[b], weighted, target, margin_ids
        )
        if margin is not None and block_margin is not None:
            margin[b, m] = block_margin
    # a_p ≥ 0 scales a row without reordering it: the same tokens, values times a_p
    weighted_values = top_values * rows[:, positions, None]
    top_ids, ranks = top_ids.reshape(-1, width), ranks.reshape(-1)
    return PositionViews(
        Increase(increase, margin),
        VocabSummary(top_ids, top_values.reshape(-1, width), ranks),
        VocabSummary(top_ids, weighted_values.reshape(-1, width), ranks),
    )
