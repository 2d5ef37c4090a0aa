"""Fixed mode's per-position views of K detailed heads: each value projected once serves its
subheadvalue's increase (a_p · L on the base), its label margin and, at label positions, the
label tables (top tokens and label ranks of L and of a_p · L)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from model_worker.analysis.contributions import (
    Increase,
    base_logprobs,
    blocks,
    target_logprob,
)
from model_worker.analysis.metrics import VocabSummary, block_rows, summarize_logits
from model_worker.analysis.projection import VocabProjector
from model_worker.analysis.taylor import SmallWrites
from model_worker.resources.device_index import index_on

#: bs of chosen values: heads (a slice) at positions (a slice, or an index tensor of them) →
#: their logits [b, m, V], scratch.
ValueLogits = Callable[[slice, slice | Tensor], Tensor]


def direct_value_logits(projector: VocabProjector, values: Tensor) -> ValueLogits:
    """ValueLogits of `values` [K, S, D] projected as they are (fixed mode)."""
    return lambda heads, positions: projector.linear(values[heads][:, positions])


def labels_first(positions: list[int], n_positions: int) -> list[int]:
    """All `n_positions` positions, the (distinct) label `positions` first in their order, then
    the others ascending: in this order a block's label rows are one slice of it."""
    if len(set(positions)) != len(positions):
        raise ValueError(f"label positions must be distinct, got {positions}")
    chosen = set(positions)
    return [*positions, *(p for p in range(n_positions) if p not in chosen)]


@dataclass(frozen=True)
class ValueBlock:
    """The values of `heads` at `index` [m] (positions), projected together: the first
    `labels` rows are label positions (entries `slots` of the label list), and the rows from
    `exact` on need their increases computed exactly (the others were settled before)."""

    heads: slice
    index: Tensor
    labels: int
    slots: slice | Tensor
    exact: int


def value_blocks(
    n_heads: int,
    positions: list[int],
    n_positions: int,
    rows: int,
    device: torch.device,
    small: SmallWrites | None,
) -> Iterator[ValueBlock]:
    """Blocks of about `rows` values: every position of every head, labels first (several
    heads a block when they have few positions); with `small`, one head a block and only the
    positions still to project: its labels (those settled first) and the writes not settled."""
    n_labels = len(positions)
    order = labels_first(positions, n_positions)
    if small is None:
        index = index_on(order, device)
        for heads, part in blocks(n_heads, n_positions, rows):
            span = range(n_positions)[part]
            labels = max(0, min(span.stop, n_labels) - span.start)
            yield ValueBlock(heads, index[part], labels, slice(span.start, span.start + labels), 0)
        return
    for head, settled in enumerate(small.done.cpu().tolist()):
        slots = sorted(range(n_labels), key=lambda i: not settled[positions[i]])
        n_settled = sum(settled[p] for p in positions)
        projected = [positions[i] for i in slots]
        projected += [p for p in order[n_labels:] if not settled[p]]
        for start in range(0, len(projected), rows):
            stop = min(start + rows, len(projected))
            labels = max(0, min(stop, n_labels) - start)
            yield ValueBlock(
                slice(head, head + 1),
                torch.tensor(projected[start:stop], device=device),
                labels,
                torch.tensor(slots[start : start + labels], dtype=torch.long, device=device),
                min(max(0, n_settled - start), stop - start),
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
    value_logits: ValueLogits,
    rows: Tensor,
    target: int,
    positions: list[int],
    rank_ids: Tensor,
    k: int,
    margin_ids: tuple[int, int] | None = None,
    chunk: int | None = None,
    base_logits: Tensor | None = None,
    small: SmallWrites | None = None,
) -> PositionViews:
    """Fixed mode only: bs is linear, so one projection L = bs(v_p W_O^h) of each value serves
    both its subheadvalue (a_p · L) and the label tables at `positions`.

    bases [K, D], value_logits(heads, positions): L of those values [b, m, V] (see
    `direct_value_logits`), rows [K, S] (attention of the last position), rank_ids [P] (the
    token to rank at each label position); `small`: the writes whose increases were settled
    without projecting them (`analysis.taylor`), whose values are then projected only at label
    positions. Positions are projected labels first, so that each block's label rows are
    summarised where they lie, a view of the block, not a copy.
    """
    if projector.mode != "fixed":
        raise ValueError("position_views_fixed needs the fixed norm mode")
    if base_logits is None:
        base_logits = projector.logits(bases)
    base_logprob = base_logprobs(projector, base_logits, target)
    n_heads, n_positions = rows.shape
    rank_ids = rank_ids.to(rows.device)
    if small is None:
        increase = rows.new_empty(n_heads, n_positions)
        margin = None if margin_ids is None else rows.new_empty(n_heads, n_positions)
    else:
        increase = small.increase.clone()
        margin = None if small.margin is None else small.margin.clone()
    width = min(k, projector.vocab)
    top_ids = torch.zeros(n_heads, len(positions), width, dtype=torch.long, device=rows.device)
    top_values = rows.new_zeros(n_heads, len(positions), width)
    ranks = torch.zeros(n_heads, len(positions), dtype=torch.long, device=rows.device)
    size = chunk or block_rows(projector.vocab, rows.device)
    for block in value_blocks(n_heads, positions, n_positions, size, rows.device, small):
        heads = block.heads
        logits = value_logits(heads, block.index)  # [b, m, V]
        if block.labels:  # the label tables, before the values are weighted
            chosen = logits[:, : block.labels]  # [b, P', V]
            shape = chosen.shape[:2]
            wanted = rank_ids[block.slots].expand(shape).reshape(-1)
            summary = summarize_logits(chosen.reshape(-1, chosen.shape[-1]), k, wanted)
            top_ids[heads, block.slots] = summary.top_ids.view(*shape, -1)
            top_values[heads, block.slots] = summary.top_values.view(*shape, -1)
            ranks[heads, block.slots] = summary.ranks.view(shape)
        if block.exact == logits.shape[1]:
            continue
        exact, index = logits[:, block.exact :], block.index[block.exact :]
        weight = rows[heads][:, index, None]  # [b, m, 1]: a_p
        if margin is not None and margin_ids is not None:
            first, second = exact[..., margin_ids[0]], exact[..., margin_ids[1]]
            margin[heads, index] = first * weight[..., 0] - second * weight[..., 0]
        # bs(x) + a_p · L in one pass, written over L
        full = torch.addcmul(base_logits[heads, None, :], exact, weight, out=exact)
        increase[heads, index] = target_logprob(projector, full, target) - base_logprob[heads, None]
    # a_p ≥ 0 scales a row without reordering it: the same tokens, values times a_p
    weighted_values = top_values * rows[:, index_on(positions, rows.device), None]
    top_ids, ranks = top_ids.reshape(-1, width), ranks.reshape(-1)
    return PositionViews(
        Increase(increase, margin),
        VocabSummary(top_ids, top_values.reshape(-1, width), ranks),
        VocabSummary(top_ids, weighted_values.reshape(-1, width), ranks),
    )
