"""The factored unembedding of recurring heads: a head's values projected through its kept
U_h = W_O^h · bs (DESIGN.md's `bs`), built where it pays for itself."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from model_worker.analysis.head_unembedding import FactoredValues, head_unembedding
from model_worker.analysis.projection import VocabProjector
from model_worker.model.architectures import HeadGeometry
from model_worker.model.loading import LoadedModel
from model_worker.resources.device_index import index_on
from model_worker.resources.unembedding_cache import HeadUnembeddings
from model_worker.run.state import final_projector

#: A recurring head's U_h is built where it pays for itself within this many more prompts: it
#: costs d_head rows of the unembedding once and saves n (1 − d_head / D) a prompt (n: the
#: head's vectors projected per prompt, all positions for a detailed head, the labels for a
#: baseline head). Where building it and projecting through it already cost less than the n
#: direct rows (d_head ≤ n (1 − d_head / D): long prompts), it is built at first sight.
PAYBACK_PROMPTS = 4


def factored_values(
    *,
    kept: HeadUnembeddings,
    projector: VocabProjector,
    geometry: HeadGeometry,
    heads: list[tuple[int, int]],
    values: Callable[[list[tuple[int, int]]], Tensor],
    v: Tensor,
    w_o: dict[int, Tensor],
    attn_scale: Tensor,
) -> FactoredValues | None:
    """The heads' values factored: those of heads detailed before projected through their U_h
    from `kept` (fixed mode, and where d_head ≤ PAYBACK_PROMPTS · n; at first sight where that
    is cheaper already), the others' values [., n, D] from `values(those heads)` only; None:
    all as they are (the caller computes every head's values). v [L, n, n_kv, d_head] at the
    values' positions, w_o per layer [H, d_head, D], attn_scale [L, 1] at the analysed
    position."""
    n, d_head = v.shape[1], geometry.d_head
    if projector.mode != "fixed" or d_head > PAYBACK_PROMPTS * n:
        return None
    at_first_sight = d_head <= n * (1 - d_head / geometry.d_model)
    unembeddings = [
        kept.recurring(
            (layer, head),
            partial(head_unembedding, projector, w_o[layer][head]),
            at_first_sight=at_first_sight,
        )
        for layer, head in heads
    ]
    if all(u is None for u in unembeddings):
        return None
    layers = index_on([layer for layer, _ in heads], v.device)
    kv = index_on([geometry.kv_head(head) for _, head in heads], v.device)
    z = v[layers, :, kv] * attn_scale[layers][:, :, None]  # [K, n, d_head]
    direct = [key for key, u in zip(heads, unembeddings, strict=True) if u is None]
    plain = values(direct) if direct else z.new_empty(0, n, geometry.d_model)
    return FactoredValues(plain, z, unembeddings)


def unembedding_builder(loaded: LoadedModel) -> Callable[[tuple[int, int]], Tensor] | None:
    """Builds the U_h of a head (layer, head) of `loaded` from its weights alone, as
    `factored_values` does in an analysis: for `HeadUnembeddings.build_seen` between jobs.
    None where the weights span several devices (an analysis builds U_h on its capture's)."""
    devices = {p.device for p in loaded.model.parameters()}
    if len(devices) != 1:
        return None
    (device,) = devices
    g = loaded.geometry
    # U_h does not involve the frozen final scale: any final residual serves
    projector = final_projector(loaded, torch.ones(g.d_model, device=device), "fixed")
    w_o: dict[int, Tensor] = {}

    def build(key: tuple[int, int]) -> Tensor:
        layer, head = key
        if layer not in w_o:  # one layer's (fp32 copy, for a bf16 model) at a time
            w_o.clear()
            w_o[layer] = loaded.adapter.w_out(loaded.model, layer, g).to(device)
        return head_unembedding(projector, w_o[layer][head])

    return build
