"""Random-head controls: draws of as many *distinct* heads as were located, each draw listed.

A draw never repeats a head, and never contains a located head. `same_layer` draws mirror the
located heads' layers (one head of each located head's layer, so two located heads of layer 23
get two different random heads of layer 23); otherwise the heads come from a pool (all
non-located heads, or the deep ones). Draw d uses `random.Random(seed * 1_000_003 + d)`, so a
seed gives the same draws in every experiment.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from model_worker.analysis.baseline import random_heads
from model_worker.model.interventions import Head

DRAWS = 5


def _rng(seed: int, draw: int) -> random.Random:
    return random.Random(seed * 1_000_003 + draw)


def same_layer_draws(
    located: Sequence[Head], n_heads: int, seed: int, draws: int = DRAWS
) -> list[list[Head]]:
    """`draws` lists of distinct non-located heads, one from each located head's layer (a
    layer whose other heads are used up contributes no more). In draw 1 the first located head
    of each layer gets the dashboard's baseline head of that layer
    (model_worker/analysis/baseline.py), so the two compare against the same head."""
    studied = set(located)
    baseline = random_heads(located, n_heads, seed)
    out = []
    for d in range(draws):
        rng = _rng(seed, d)
        taken: set[Head] = set()
        draw = []
        for layer, _ in located:
            free = [(layer, h) for h in range(n_heads) if (layer, h) not in studied | taken]
            if free:
                dashboard = (layer, baseline[layer]) if layer in baseline else None
                first = d == 0 and dashboard is not None and dashboard in free
                head = dashboard if first and dashboard is not None else rng.choice(free)
                taken.add(head)
                draw.append(head)
        out.append(draw)
    return out


def pool_draws(
    located: Sequence[Head], pool: Sequence[Head], seed: int, draws: int = DRAWS
) -> list[list[Head]]:
    """`draws` samples of len(located) distinct heads of `pool` outside `located`."""
    studied = set(located)
    candidates = [h for h in pool if h not in studied]
    k = min(len(located), len(candidates))
    return [_rng(seed, d).sample(candidates, k) for d in range(draws)]
