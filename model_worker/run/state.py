"""One captured prompt at its analysed (last) position, and the final projector `bs(·)` there."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from model_worker.analysis.icl import IclStructure
from model_worker.analysis.metrics import VocabSummary
from model_worker.analysis.projection import FinalNorm, VocabProjector
from model_worker.contracts.common import NormMode, TopTokens
from model_worker.model.capture import RunCache
from model_worker.model.loading import LoadedModel
from model_worker.model.prompting import Encoded, ReadPrompt
from model_worker.resources.device_memory import to_device


def final_projector(loaded: LoadedModel, x_final: Tensor, mode: NormMode) -> VocabProjector:
    """The VocabProjector of `loaded` at the analysed position's final residual `x_final` [D]."""
    adapter, device = loaded.adapter, x_final.device
    norm = adapter.final_norm(loaded.model)
    w_u, b_u = loaded.unembedding()
    return VocabProjector.at(
        FinalNorm(
            norm.kind,
            to_device(norm.weight, device),
            None if norm.bias is None else to_device(norm.bias, device),
            norm.eps,
        ),
        to_device(w_u, device),
        None if b_u is None else to_device(b_u, device),
        mode,
        x_final,
        adapter.final_softcap,
    )


@dataclass(frozen=True)
class PromptRun:
    """One captured prompt at its analysed (last) position, with its target and labels."""

    loaded: LoadedModel
    cache: RunCache
    #: the prompt as read once at the start of the run (tokens, labels, demonstrations)
    read: ReadPrompt
    projector: VocabProjector
    target: int
    k: int
    #: each summary's top-token texts, nested as its ids, by id(summary) (`tops`)
    _top_texts: dict[int, tuple[VocabSummary, list[Any]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @cached_property
    def pre_logits(self) -> Tensor:
        """bs(resid_pre_l) at the last position for every layer [L, V]: the base of the
        attention layers, of every head and of every subheadvalue."""
        return self.projector.logits(self.cache.resid_pre[:, 0, self.cache.at(self.last)])

    @cached_property
    def ids(self) -> list[int]:
        """The prompt's token ids as plain ints (read per label and per head: a tensor index
        each was thousands of small torch calls an analysis)."""
        return [int(i) for i in self.encoded.ids.tolist()]

    @property
    def encoded(self) -> Encoded:
        return self.read.encoded

    @property
    def structure(self) -> IclStructure:
        return self.read.structure

    @property
    def last(self) -> int:
        return self.read.last_position

    @property
    def label_positions(self) -> list[int]:
        return list(self.read.label_positions)

    def is_true(self, position: int) -> bool:
        return self.ids[position] == self.target

    def margin_ids(self) -> tuple[int, int] | None:
        """(target-side label, other label) token ids when the prompt has exactly two labels."""
        ids = list(dict.fromkeys(self.ids[p] for p in self.label_positions))
        if len(ids) != 2:
            return None
        return (ids[1], ids[0]) if ids[1] == self.target else (ids[0], ids[1])

    def w_o(self, layer: int) -> Tensor:
        """Each head's write into the residual per unit of z (W_O, post-norm γ folded in)."""
        g = self.loaded.geometry
        return to_device(
            self.loaded.adapter.w_out(self.loaded.model, layer, g), self.cache.z.device
        )

    def kv_index(self) -> Tensor:
        g = self.loaded.geometry
        return torch.tensor([g.kv_head(h) for h in range(g.n_heads)])

    def top_columns(self, summary: VocabSummary, *index: int) -> tuple[Any, Any, Any]:
        """Row `index` of `summary`'s top ids, texts and values, as (nested) lists: the texts
        of a summary's ids are looked up at once, at its first read."""
        ids, values = summary.top_lists
        texts = self._top_texts.get(id(summary), (summary, None))[1]
        if texts is None:
            texts = self.loaded.token_texts(summary.top_ids)
            self._top_texts[id(summary)] = (summary, texts)  # the summary kept: its id stays
        for i in index:
            ids, texts, values = ids[i], texts[i], values[i]
        return ids, texts, values

    def tops(self, summary: VocabSummary, *index: int) -> TopTokens:
        """The top tokens of one projected vector (row `index` of `summary`), its columns as
        they came to the host (~7,000 lists a 512-token analysis: built, not validated)."""
        return TopTokens.columns(*self.top_columns(summary, *index))
