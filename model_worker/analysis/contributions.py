"""Per-head outputs, subheadvalues, and their log-probability increases (paper Fig. 2–4, 7)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model_worker.analysis.metrics import block_rows
from model_worker.analysis.projection import VocabProjector
from model_worker.resources.device_memory import room_for


def head_outputs(z: Tensor, w_o: Tensor) -> Tensor:
    """Each head's write into the residual: z [..., H*d_head], W_O [H, d_head, D] → [..., H, D].

    Their sum plus the output bias is the attention output. One `bmm` over the heads (the
    einsum it replaces made 13 operator calls of its permutes and views, 5 here: a layer's
    host time on a GPU).
    """
    n_heads, d_head, d_model = w_o.shape
    z_heads = z.reshape(-1, n_heads, d_head).transpose(0, 1)  # [H, N, d_head]
    return torch.bmm(z_heads, w_o).transpose(0, 1).reshape(*z.shape[:-1], n_heads, d_model)


def value_outputs(v: Tensor, w_o: Tensor, kv_index: Tensor) -> Tensor:
    """Unweighted label values v_p W_O^h for every source position.

    v [S, n_kv, d_head], W_O [H, d_head, D], kv_index [H] (query head → its K/V head)
    → [H, S, D].
    """
    return torch.einsum("shd,hdm->hsm", v[:, kv_index, :], w_o)


def positions_z(v: Tensor, pattern_row: Tensor, kv_index: Tensor, positions: list[int]) -> Tensor:
    """Σ_{p ∈ positions} a_{h,p} v_p for every head: the part of z that `positions` write.

    v [..., S, n_kv, d_head], pattern_row [..., H, S] (last query row), kv_index [H]
    → [..., H*d_head], laid out like the captured z, so `head_outputs` turns it into each
    head's residual write. Leading axes (layers) are shared by v and pattern_row.
    """
    lead = pattern_row.shape[:-2]
    if not positions:
        return v.new_zeros(*lead, pattern_row.shape[-2] * v.shape[-1])
    chosen = v[..., positions, :, :][..., kv_index, :]  # [..., P, H, d_head]
    z = torch.einsum("...hp,...phd->...hd", pattern_row[..., positions], chosen)
    return z.reshape(*lead, -1)


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


def base_logprobs(projector: VocabProjector, base_logits: Tensor, target: int) -> Tensor:
    """log softmax(cap(bs(x)))[target] of bases whose bs is `base_logits` [B, V] → [B].

    Through the same fused log-softmax as the summed rows (`target_logprob`): an increase is
    the difference of two such log-probabilities, and their fp32 sums of V exponentials, taken
    in one order, round alike and cancel. (With `torch.logsumexp` here, whose sum is ordered
    otherwise, SmolLM2's increases were up to 1.1e-5 from float64's; now 3.7e-6.)"""
    return target_logprob(projector, base_logits.clone(), target)


def target_logprob(projector: VocabProjector, full: Tensor, target: int) -> Tensor:
    """log softmax(cap(full))[..., target] of summed logits `full` [..., V], consumed as
    scratch: the soft-cap and the log-softmax work in place (one fused pass per row)."""
    full = projector.cap(full)
    return torch.log_softmax(full, -1, out=full)[..., target]


def _increase(
    projector: VocabProjector,
    base_logits: Tensor,
    delta: Tensor,
    target: int,
    margin_ids: tuple[int, int] | None,
    base_logprob: Tensor,
) -> tuple[Tensor, Tensor | None]:
    """Increase [b, M] (and margin) of `delta` [b, M, V] on `base_logits` [b, V], whose
    log-probability of the target is `base_logprob` [b], with any final soft-cap applied to the
    summed logits.

    `delta` (a whole block of logits) is consumed as scratch.
    """
    margin = None if margin_ids is None else delta[..., margin_ids[0]] - delta[..., margin_ids[1]]
    logprob = target_logprob(projector, delta.add_(base_logits[:, None, :]), target)
    return logprob - base_logprob[:, None], margin


def blocks(n_bases: int, n_vectors: int, rows: int) -> list[tuple[slice, slice]]:
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
    base_logprob = base_logprobs(projector, base_logits, target)
    rows = chunk or block_rows(projector.vocab, vectors.device)
    increase = vectors.new_empty(vectors.shape[:2])
    margin = None if margin_ids is None else vectors.new_empty(vectors.shape[:2])
    for b, m in blocks(vectors.shape[0], vectors.shape[1], rows):
        delta = projector.delta(base_logits[b], bases[b], vectors[b, m])
        increase[b, m], block_margin = _increase(
            projector, base_logits[b], delta, target, margin_ids, base_logprob[b]
        )
        if margin is not None and block_margin is not None:
            margin[b, m] = block_margin
    return Increase(increase, margin)


#: Smallest room for bs(whole) kept from the whole increases for the split into label / other
#: parts (SmolLM2's 270 heads: 53 MB); it may take up to KEEP_LOGITS_SHARE of the device's free
#: memory (a 1B model's 512 heads: 263 MB; an 8B's 1,024: 525 MB); beyond, the split projects
#: the whole again.
KEEP_LOGITS_BYTES = 256 * 2**20
KEEP_LOGITS_SHARE = 0.125


@dataclass(frozen=True)
class WholeIncrease:
    """I(whole | x) [B, M] and, in fixed mode when it fits the room, bs_linear(whole)
    [B, M, V] for `part_increases` (None: it projects the whole again)."""

    increase: Tensor
    logits: Tensor | None


def whole_increase(
    projector: VocabProjector,
    bases: Tensor,
    whole: Tensor,
    target: int,
    base_logits: Tensor | None = None,
) -> WholeIncrease:
    """I(whole | x) [B, M] for `whole` [B, M, D] on `bases` [B, D], keeping (fixed mode) its
    linear logits so that `part_increases` projects only the parts."""
    if base_logits is None:
        base_logits = projector.logits(bases)
    n_bases, n_vectors = whole.shape[:2]
    size = n_bases * n_vectors * projector.vocab * whole.element_size()
    room = room_for(whole.device, KEEP_LOGITS_SHARE, KEEP_LOGITS_BYTES)
    if projector.mode != "fixed" or size > room:
        whole_only = logprob_increase(projector, bases, whole, target, base_logits=base_logits)
        return WholeIncrease(whole_only.increase, None)
    base_logprob = base_logprobs(projector, base_logits, target)
    kept = whole.new_empty(n_bases, n_vectors, projector.vocab)
    increase = whole.new_empty(n_bases, n_vectors)
    for b, m in blocks(n_bases, n_vectors, block_rows(projector.vocab, whole.device)):
        linear = projector.linear(whole[b, m])
        kept[b, m] = linear
        full = linear.add_(base_logits[b, None, :])  # bs(x + whole)
        increase[b, m] = target_logprob(projector, full, target) - base_logprob[b, None]
    return WholeIncrease(increase, kept)


def part_increases(
    projector: VocabProjector,
    bases: Tensor,
    whole: Tensor,
    part: Tensor,
    target: int,
    base_logits: Tensor | None = None,
    whole_logits: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """I(part | x) and I(whole − part | x), [B, M] each, for `whole` and `part` [B, M, D] on
    `bases` [B, D]. In fixed mode bs is linear, so the rest's logits are the whole's (kept by
    `whole_increase`, else projected again) minus the part's: `whole_logits` is consumed
    (overwritten as scratch)."""
    if base_logits is None:
        base_logits = projector.logits(bases)
    if projector.mode != "fixed":
        stacked = torch.cat([part, whole - part], 1)
        increase = logprob_increase(projector, bases, stacked, target, base_logits=base_logits)
        part_increase, rest = increase.increase.split(whole.shape[1], 1)
        return part_increase, rest
    base_logprob = base_logprobs(projector, base_logits, target)
    rows = block_rows(projector.vocab, whole.device)
    out = [whole.new_empty(whole.shape[:2]) for _ in range(2)]
    for b, m in blocks(whole.shape[0], whole.shape[1], rows):
        base = base_logits[b, None, :]
        whole_linear = projector.linear(whole[b, m]) if whole_logits is None else whole_logits[b, m]
        part_logits = projector.linear(part[b, m])
        rest_full = whole_linear.sub_(part_logits).add_(base)  # bs(x + whole − part), linearity
        part_full = part_logits.add_(base)
        for i, full in enumerate((part_full, rest_full)):
            out[i][b, m] = target_logprob(projector, full, target) - base_logprob[b, None]
    return out[0], out[1]
