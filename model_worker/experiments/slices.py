"""An experiment's forward passes in slices: the unit of work that can be interleaved,
cancelled, spread over workers and merged.

Every pass over many prompts (`batching.run_prompts`) is cut into slices of whole batches
(about SLICE_PROMPTS prompts), each summarised per prompt into a `Record` (numbers and tensors
only) and merged in prompt order. The cut depends on the batch size alone, never on how many
workers run it, so a result is the same whether one worker ran every slice or several shared
them. A `Slicer` decides how the slices of each pass are obtained: this process computes them
in order, calling `checkpoint()` before each (the embedded server runs waiting interactive
jobs there, and raises JobCancelled for a cancelled experiment); the lab server's slicer
(model_worker.service.chunks) keeps them in Redis, where other workers help.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

#: About how many prompts one slice holds (rounded up to whole batches).
SLICE_PROMPTS = 32
#: Prompts per slice of a pass with head increases (~0.15 s a prompt on SmolLM2 in one
#: thread, against ~0.03 s without): a lab worker takes interactive work between two slices,
#: so a slice is kept to a second or two.
HEAVY_SLICE_PROMPTS = 8
#: One prompt's outcome in a pass: field name -> number, bool, None or tensor (torch.save-able
#: with weights_only=True).
Record = dict[str, Any]
ComputeSlice = Callable[[int], list[Record]]


def slice_size(batch_size: int, prompts: int = SLICE_PROMPTS) -> int:
    """Prompts per slice for `batch_size`: whole batches, at least `prompts` prompts; `prompts`
    alone when that is under one batch."""
    if prompts < batch_size:
        return prompts
    return batch_size * max(1, math.ceil(prompts / batch_size))


def cut(n_items: int, batch_size: int, prompts: int = SLICE_PROMPTS) -> list[range]:
    """The slices of a pass over `n_items` prompts: consecutive index ranges of about
    `prompts` prompts (`slice_size`)."""
    size = slice_size(batch_size, prompts)
    return [range(start, min(n_items, start + size)) for start in range(0, n_items, size)]


class Slicer:
    """Computes each pass's slices here, in order, `checkpoint()` before each one."""

    def __init__(self, checkpoint: Callable[[], None] | None = None) -> None:
        self._checkpoint = checkpoint
        #: passes asked for so far (what progress messages number)
        self.passes = 0

    def checkpoint(self) -> None:
        if self._checkpoint is not None:
            self._checkpoint()

    def pause_point(self) -> None:
        """Inside a slice (after a batch, between two layers of a head-increase table): the
        embedded server runs waiting interactive jobs here as between slices, so none waits
        behind a whole slice (on SmolLM2 a slice with head increases takes ~7 s on one
        thread); a lab chunk only stops for a cancel (`ChunkSlicer`)."""
        self.checkpoint()

    def skipped(self, passes: int) -> None:
        """`passes` served from this process's memory instead (a located experiment's
        location): counted as asked for, so that messages number the passes alike whether
        or not a replay ran them."""
        self.passes += passes

    def run(
        self,
        digest: str,
        n_slices: int,
        compute: ComputeSlice,
        on_slice: Callable[[int], None],
    ) -> list[list[Record]]:
        """The records of every slice of one pass (`digest` names the pass's prompts and
        options), `on_slice(i)` once slice i is in hand."""
        self.passes += 1
        out = []
        for i in range(n_slices):
            self.checkpoint()
            out.append(compute(i))
            on_slice(i)
        return out


_CURRENT: ContextVar[Slicer | None] = ContextVar("icl_slicer", default=None)


def current_slicer() -> Slicer:
    """The slicer of the experiment running in this context (a plain one outside of any)."""
    found = _CURRENT.get()
    return Slicer() if found is None else found


@contextmanager
def slicing(slicer: Slicer) -> Iterator[Slicer]:
    """Run an experiment's passes through `slicer`."""
    token = _CURRENT.set(slicer)
    try:
        yield slicer
    finally:
        _CURRENT.reset(token)


def merged(records: Sequence[Sequence[Record]]) -> list[Record]:
    """The records of a pass's slices, in prompt order."""
    return [record for part in records for record in part]
