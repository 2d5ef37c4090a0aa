"""Which branch of an analysis a device takes where the CPU and a GPU differ.

On the CPU the maths bounds an analysis; on a GPU the maths is cheap and its host's thousands of
small launches bound it. So a few steps branch on the device: the Taylor expansion of small
writes (`analysis.details.settled_writes`: CPU only, its per-head decisions would add launches),
label ranks (`analysis.metrics.rank_of`: a cache-sized scratch block on the CPU, one comparison
elsewhere) and the factored heads' value blocks (`analysis.head_unembedding.FactoredValues`: one
head a block on the CPU, several on a GPU). `gpu_branches()` makes the CPU take a GPU's branches,
so that a GPU's path can be tested and its calls counted here (`bench/bench_host.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_GPU_BRANCHES_ON_CPU: ContextVar[bool] = ContextVar("gpu_branches_on_cpu", default=False)


def host_bound(device: torch.device) -> bool:
    """True where an analysis takes a GPU's branches: any device but the CPU, and the CPU too
    inside `gpu_branches()`."""
    return device.type != "cpu" or _GPU_BRANCHES_ON_CPU.get()


@contextmanager
def gpu_branches() -> Iterator[None]:
    """Inside it, analyses on the CPU take the branches a GPU takes (`host_bound`)."""
    token = _GPU_BRANCHES_ON_CPU.set(True)
    try:
        yield
    finally:
        _GPU_BRANCHES_ON_CPU.reset(token)
