"""The head atlas, pure parts: attention-pattern scores of the head types the field has named,
and rank correlations between per-head scores.

- induction score (Olsson et al. 2022): on a random token sequence repeated once, the mean
  attention from each token of the second copy to the token after its earlier occurrence;
- previous-token score: the mean attention from each token to the one before it;
- sink share: the attention from the last position to position 0.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor


def repeated_sequences(
    vocabulary: list[int], rows: int, half: int, generator: torch.Generator
) -> Tensor:
    """[rows, 2·half] token ids: `half` random tokens of `vocabulary` (without repeats
    inside a copy when the vocabulary allows), then the same tokens again."""
    pool = torch.tensor(vocabulary)
    draws = []
    for _ in range(rows):
        if len(vocabulary) >= half:
            pick = pool[torch.randperm(len(vocabulary), generator=generator)[:half]]
        else:
            pick = pool[torch.randint(len(vocabulary), (half,), generator=generator)]
        draws.append(torch.cat([pick, pick]))
    return torch.stack(draws)


def induction_scores(pattern: Tensor, half: int) -> Tensor:
    """[L, H]: mean over rows and over every token of the second copy (i ≥ half; the first,
    a repeat of token 0, has its target at 1 like the rest) of the attention from i to
    i − half + 1. `pattern` [L, B, H, 2·half, 2·half]."""
    queries = torch.arange(half, 2 * half)
    keys = queries - half + 1
    return pattern[..., queries, keys].mean(dim=(1, -1))


def previous_token_scores(pattern: Tensor) -> Tensor:
    """[L, H]: mean over rows and positions i ≥ 1 of the attention from i to i − 1.
    `pattern` [L, B, H, S, S]."""
    queries = torch.arange(1, pattern.shape[-1])
    return pattern[..., queries, queries - 1].mean(dim=(1, -1))


def ranks(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """Ranks along the last axis (0 = smallest; ties broken by order, rare for floats)."""
    return np.argsort(np.argsort(values, axis=-1), axis=-1).astype(np.float64)


def spearman(columns: NDArray[np.float64]) -> NDArray[np.float64]:
    """Spearman's ρ of the two rows of [..., 2, n] along the last axis (NaN when a row is
    constant)."""
    r = ranks(columns)
    centred = r - r.mean(-1, keepdims=True)
    a, b = centred[..., 0, :], centred[..., 1, :]
    denominator = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    varies = (np.ptp(columns, axis=-1) > 0).all(-1)  # ranks of a constant row mean nothing
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(varies & (denominator > 0), (a * b).sum(-1) / denominator, np.nan)


def top_k(scores: NDArray[np.float64], k: int) -> list[int]:
    """Flat indices of the k largest scores, largest first."""
    return [int(i) for i in np.argsort(-scores, kind="stable")[:k]]
