"""Pre-softmax attention scores of the analysed position, and their content/position split.

Pure maths on recorded queries and keys (model_worker.qk): the score of query q to key k is
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
    scores = keys @ query * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    return scores if mask is None else scores + mask


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
    n = keys.shape[0]
    excluded = masked(mask, n)
    score = attention_scores(query, keys, scaling, softcap, mask)
    if unrotate is None:
        return ScoreSplit(score, score, None, excluded)
    plain_query = unrotate(query[None, None], [n - 1])[0, 0]
    plain_keys = unrotate(keys[None], range(n))[0]
    content = attention_scores(plain_query, plain_keys, scaling, softcap, mask)
    return ScoreSplit(score, content, score - content, excluded)


def rotary_offset_queries(
    *, query: Tensor, positions: list[int], w_k: Tensor, unrotate: Unrotate
) -> Tensor:
    """W_K^⊤ R_Δ q for each of `positions` (Δ = last − p): [P, D], from the analysed position's
    query [d] after rotary and the head's W_K [d, D].

    With q_last = R_last q the real (rotated) query, R_Δ q = R_{−p} q_last: the query un-rotated
    by the label position's angles, which a key at p scores against its unrotated key.
    """
    seen = unrotate(query.expand(len(positions), -1)[None], positions)[0]
    return seen @ w_k.to(seen.device).T
