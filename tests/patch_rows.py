"""Rows through a model, counted where every row ends: its last layer's MLP (a batch of R rows
counts R). A patched row that starts at a later layer than the first (the growing batches of
`model_worker.patching.hooks`) never enters the model's own forward, but it ends there too."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

from model_worker.model.loading import LoadedModel


@contextmanager
def rows_counted(loaded: LoadedModel) -> Iterator[list[int]]:
    """The batch size of every pass through `loaded`'s last layer while the block runs."""
    rows: list[int] = []

    def count(module: nn.Module, args: Any, output: Any) -> None:
        rows.append(int(output.shape[0]))

    last = loaded.adapter.sub(loaded.model, loaded.geometry.n_layers - 1, loaded.adapter.spec.mlp)
    handle = last.register_forward_hook(count)
    try:
        yield rows
    finally:
        handle.remove()
