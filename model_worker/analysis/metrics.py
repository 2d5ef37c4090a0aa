"""Ranks, reciprocal ranks and top-k token lists of vocabulary projections."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


def mean_reciprocal_rank(ranks: list[int]) -> float:
    """Mean of 1/rank; 0.0 for no ranks."""
    return sum(1.0 / r for r in ranks) / len(ranks) if ranks else 0.0


@dataclass(frozen=True)
class VocabSummary:
    """Top-k ids/values [N, k] of N projected vectors, and label ranks [N] where asked for."""

    top_ids: Tensor
    top_values: Tensor
    ranks: Tensor


def summarize_projections(
    project: Callable[[Tensor], Tensor],
    vectors: Tensor,
    k: int,
    rank_ids: Tensor,
    chunk: int = 256,
) -> VocabSummary:
    """Project `vectors` [N, D] through `project` `chunk` rows at a time (one pass over the
    unembedding per chunk), keeping the top k tokens and the 1-based rank of `rank_ids` [N]
    (−1 entries get rank 0)."""
    ids, values, ranks = [], [], []
    for start in range(0, vectors.shape[0], chunk):
        logits = project(vectors[start : start + chunk])
        top = logits.topk(min(k, logits.shape[-1]), dim=-1)
        ids.append(top.indices)
        values.append(top.values)
        wanted = rank_ids[start : start + chunk]
        reference = logits.gather(-1, wanted.clamp(min=0)[:, None])
        rank = (logits > reference).sum(-1) + 1
        ranks.append(torch.where(wanted >= 0, rank, torch.zeros_like(rank)))
    if not ids:
        empty = torch.zeros(0, k, dtype=torch.long, device=vectors.device)
        return VocabSummary(empty, empty.float(), empty[:, 0])
    return VocabSummary(torch.cat(ids), torch.cat(values), torch.cat(ranks))
