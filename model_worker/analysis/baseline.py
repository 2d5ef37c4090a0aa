"""The baseline head of a layer: a random head of that layer outside the heads under study,
drawn reproducibly. The dashboard's head details (`random_head`, seed 0) and the experiments
(experiment 3's `random_head`, the matching test's random heads; the request's seed) draw it
here, so for the same heads and seed they compare against the same heads."""

from __future__ import annotations

import random
from collections.abc import Iterable


def random_heads(heads: Iterable[tuple[int, int]], n_heads: int, seed: int = 0) -> dict[int, int]:
    """Layer → baseline head, for each layer of `heads` (layer, head): one of that layer's
    heads not in `heads`, chosen by `random.Random(seed * 1_000_003 + layer)`; a layer whose
    heads are all in `heads` gets none."""
    studied = set(heads)
    chosen = {}
    for layer in sorted({layer for layer, _ in studied}):
        others = [h for h in range(n_heads) if (layer, h) not in studied]
        if others:
            chosen[layer] = random.Random(seed * 1_000_003 + layer).choice(others)
    return chosen
