"""Position indices kept on the device they index.

Indexing a GPU tensor with a Python list, or with a CPU tensor, first copies the index from
pageable host memory, and CUDA synchronises the stream before such a copy: the host waits for
every kernel it queued, so its Python and the GPU's kernels take turns instead of overlapping.
A capture indexed its kept positions ~7 times a layer, the query rotations once a head. Made
once per (positions, device), the index is a device tensor every later use reads in place.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor


def index_on(positions: Sequence[int], device: torch.device) -> Tensor:
    """`positions` as a long tensor on `device` (cached: one copy per positions and device)."""
    return _index_on(tuple(int(p) for p in positions), torch.device(device))


@functools.lru_cache(maxsize=256)
def _index_on(positions: tuple[int, ...], device: torch.device) -> Tensor:
    return torch.tensor(positions, dtype=torch.long, device=device)
