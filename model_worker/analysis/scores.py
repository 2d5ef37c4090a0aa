"""Pre-softmax attention scores of the analysed position, and their content/position split.

Pure maths on recorded queries and keys (model_worker.model.qk): the score of query q to key k is
`softcap(q·k · scaling) + mask`, exactly as eager attention computes it, so a softmax over a
row of scores is that row of the attention pattern. The *content* score uses the query and keys
without their rotary rotation (same scaling, soft-cap and mask); the *position* score is the
remainder, score − content (none for learned positions, which enter through the residual).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


def attention_scores(
    query: Tensor, keys: Tensor, scaling: float, softcap: float | None, mask: Tensor | None
) -> Tensor:
    """Scores of one query [d] to keys [S, d] → [S]; `mask` [S] is the additive mask row."""
    return attention_scores_of(keys @ query, scaling, softcap, mask)


def masked(mask: Tensor | None, n: int) -> Tensor:
    """[n] bool: the positions an additive mask row [n] (or None) excludes from the softmax."""
    if mask is None:
        return torch.zeros(n, dtype=torch.bool)
    return (mask <= torch.finfo(mask.dtype).min / 2).cpu()


@dataclass(frozen=True)
class ScoreSplit:
    """One head's scores [S] of the analysed position, its content part and the position
    remainder (None without rotary), and which positions the mask excludes."""

    score: Tensor
    content: Tensor
    position: Tensor | None
    excluded: Tensor

    def values(self, which: Tensor | None) -> list[float | None]:
        """`which` as plain floats, None at excluded positions (None for no tensor)."""
        if which is None:
            return []
        return [
            None if out else float(v)
            for v, out in zip(which.tolist(), self.excluded.tolist(), strict=True)
        ]


#: Un-rotates x [n, P, d] by the rotary angles of `positions` (the family's own rotary).
Unrotate = Callable[[Tensor, Sequence[int]], Tensor]


@dataclass(frozen=True)
class ScoreSplits:
    """The ScoreSplit of several heads at once, [K, S] each (row i: head i's)."""

    score: Tensor
    content: Tensor
    position: Tensor | None
    excluded: Tensor

    def __getitem__(self, i: int) -> ScoreSplit:
        position = None if self.position is None else self.position[i]
        return ScoreSplit(self.score[i], self.content[i], position, self.excluded[i])


def score_splits(
    *,
    queries: Tensor,
    keys: Tensor,
    scaling: float,
    softcap: float | None,
    masks: Tensor | None,
    unrotate: Unrotate | None,
) -> ScoreSplits:
    """`score_split` of K heads of the same scaling, soft-cap and rotary at once: queries
    [K, d], keys [K, S, d], masks [K, S] (or None). The rotations and the elementwise steps
    run once for all heads; each head's dot products stay its own matrix-vector product, so
    that every number equals the one-head computation's bit for bit."""
    n = keys.shape[1]
    excluded = (
        torch.zeros(keys.shape[:2], dtype=torch.bool)
        if masks is None
        else (masks <= torch.finfo(masks.dtype).min / 2).cpu()
    )
    score = _scores(queries, keys, scaling, softcap, masks)
    if unrotate is None:
        return ScoreSplits(score, score, None, excluded)
    plain_queries = unrotate(queries[:, None], [n - 1])[:, 0]
    plain_keys = unrotate(keys, range(n))
    content = _scores(plain_queries, plain_keys, scaling, softcap, masks)
    return ScoreSplits(score, content, score - content, excluded)


def _scores(
    queries: Tensor, keys: Tensor, scaling: float, softcap: float | None, masks: Tensor | None
) -> Tensor:
    """`attention_scores` of each query [K, d] to its keys [K, S, d] → [K, S]."""
    products = torch.stack([k @ q for k, q in zip(keys, queries, strict=True)])
    return attention_scores_of(products, scaling, softcap, masks)


def attention_scores_of(
    products: Tensor, scaling: float, softcap: float | None, mask: Tensor | None
) -> Tensor:
    """The scores of the query·key `products` (`attention_scores` from its products)."""
    scores = products * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    return scores if mask is None else scores + mask


def score_split(
    *,
    query: Tensor,
    keys: Tensor,
    scaling: float,
    softcap: float | None,
    mask: Tensor | None,
    unrotate: Unrotate | None,
) -> ScoreSplit:
    """The scores of the analysed position's `query` [d] (after rotary) to `keys` [S, d] (one
    per position up to it), split into content and position; `mask` [S] the additive mask row,
    `unrotate` None for a layer without rotary."""
    return score_splits(
        queries=query[None],
        keys=keys[None],
        scaling=scaling,
        softcap=softcap,
        masks=None if mask is None else mask[None],
        unrotate=unrotate,
    )[0]


def offset_queries_of(
    *, queries: Tensor, positions: list[int], w_k: Sequence[Tensor], unrotate: Unrotate
) -> Tensor:
    """W_K^⊤ R_Δ q for each of `positions` (Δ = last − p) and each of K heads of the same
    rotary, from their analysed position's queries [K, d] after rotary and each head's W_K
    [D, d] → [K, P, D]: one un-rotation for all, each head's own product.

    With q_last = R_last q the real (rotated) query, R_Δ q = R_{−p} q_last: the query un-rotated
    by the label position's angles, which a key at p scores against its unrotated key.
    """
    seen = unrotate(queries[:, None].expand(-1, len(positions), -1), positions)  # [K, P, d]
    return torch.stack([s @ w.to(s.device).T for s, w in zip(seen, w_k, strict=True)])
