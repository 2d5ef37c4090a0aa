"""Label value vectors v_p W_O^h of chosen heads at label positions, from a batch's RunCache.

W_O is the adapter's `w_out` and the values carry the post-attention norm's scale frozen at the
analysed position (DESIGN.md, "Other block shapes"); both are plain W_O and 1 without a post-norm.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from model_worker.analysis.contributions import value_outputs
from model_worker.model.capture import RunCache
from model_worker.model.loading import LoadedModel


class Values:
    """W_O (as written into the residual) per layer and the query→K/V head map, read once."""

    def __init__(self, loaded: LoadedModel) -> None:
        g = loaded.geometry
        self.w_o = [loaded.adapter.w_out(loaded.model, layer, g) for layer in range(g.n_layers)]
        self.kv = torch.tensor([g.kv_head(h) for h in range(g.n_heads)])

    def at(
        self,
        cache: RunCache,
        row: int,
        last: int,
        layer: int,
        heads: Sequence[int],
        positions: Sequence[int],
    ) -> Tensor:
        """Unweighted v_p W_O^h for `heads` of `layer` at `positions`, analysed at `last`:
        [len(heads), P, D]."""
        index = torch.tensor(list(heads))
        v = cache.v[layer, row][list(positions)]  # [P, n_kv, d_head]
        w_o = self.w_o[layer].to(v.device)[index]
        return value_outputs(v, w_o, self.kv[index]) * cache.attn_scale[layer, row, last]

    def weighted(
        self, cache: RunCache, row: int, last: int, head: tuple[int, int], positions: Sequence[int]
    ) -> Tensor:
        """Attention-weighted a_p v_p W_O^h of one head at `positions`: [P, D]."""
        layer, h = head
        attention = cache.pattern[layer, row, h, last, list(positions)]
        return attention[:, None] * self.at(cache, row, last, layer, [h], positions)[0]
