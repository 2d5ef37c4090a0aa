"""What a head scored with: its recorded pre-softmax scores split into content and position,
and its real query reverse-projected into the residual space (rotary-aware per label offset)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from model_worker.analysis.scores import (
    ScoreSplit,
    ScoreSplits,
    Unrotate,
    offset_queries_of,
    score_splits,
)
from model_worker.model.qk import LayerQk, rotate
from model_worker.resources.device_index import index_on
from model_worker.resources.device_memory import gather, to_device
from model_worker.run.state import PromptRun


def layer_qk(run: PromptRun, layer: int) -> LayerQk | None:
    """What `layer` scored with, or None for a family whose attention does not go through
    transformers' AttentionInterface (GPT-J before transformers 5.24): then it has no QK scores."""
    assert run.cache.qk is not None, "analyze captures with record_qk=True"
    record = run.cache.qk[layer]
    return record if record.query is not None and record.key is not None else None


def unrotate_by(record: LayerQk) -> Unrotate | None:
    """Un-rotation by `record`'s rotary angles, None for a layer without rotary."""
    return None if record.rotary is None else partial(rotate, record, inverse=True)


@dataclass(frozen=True)
class QkGroup:
    """Heads whose layers recorded what a batched step needs alike (`grouped`'s `kind`): one
    of their records, and their layers, each with its (index into the heads asked for, head)."""

    record: LayerQk
    layers: dict[int, list[tuple[int, int]]]

    @property
    def indices(self) -> list[int]:
        """The group's heads' indices, in the order of its rows."""
        return [i for members in self.layers.values() for i, _ in members]

    def last_queries(self, run: PromptRun) -> Tensor:
        """The recorded queries at the analysed position of the group's heads [G, d], a layer's
        heads with one index."""
        assert run.cache.qk is not None, "analyze captures with record_qk=True"
        parts = []
        for layer, members in self.layers.items():
            recorded = run.cache.qk[layer]
            assert recorded.query is not None
            chosen = index_on([head for _, head in members], recorded.query.device)
            parts.append(recorded.query[0, :, recorded.row(run.last)][chosen])
        return torch.cat(parts) if len(parts) > 1 else parts[0]


def grouped(
    run: PromptRun, heads: list[tuple[int, int]], kind: Callable[[LayerQk], Hashable]
) -> list[QkGroup]:
    """`heads` with recorded scores (`layer_qk`) grouped by `kind` of their layer's record, in
    the order first met; heads without recorded scores are in no group."""
    groups: dict[Hashable, QkGroup] = {}
    for i, (layer, head) in enumerate(heads):
        record = layer_qk(run, layer)
        if record is None:
            continue
        group = groups.setdefault(kind(record), QkGroup(record, {}))
        group.layers.setdefault(layer, []).append((i, head))
    return list(groups.values())


@dataclass(frozen=True)
class HeadScores:
    """The last position's scores of some heads, split: per group of heads recorded with the
    same rotary, scaling, soft-cap and mask kind, their indices (into the heads asked for) and
    their ScoreSplits [G, last + 1]; heads without recorded scores are in no group."""

    groups: list[tuple[list[int], ScoreSplits]]

    def per_head(self, count: int) -> list[ScoreSplit | None]:
        """Each of the `count` heads' ScoreSplit (None: no recorded scores)."""
        found: list[ScoreSplit | None] = [None] * count
        for indices, splits in self.groups:
            for row, i in enumerate(indices):
                found[i] = splits[row]
        return found


def head_scores(run: PromptRun, heads: list[tuple[int, int]]) -> HeadScores:
    """The last position's pre-softmax scores of each of `heads`, split into content and
    position: batched over the heads that share a rotary (the same recorded cos and sin: one
    un-rotation of their queries and one of their keys), each head's numbers as if alone."""
    last, g, records = run.last, run.loaded.geometry, run.cache.qk
    assert records is not None, "analyze captures with record_qk=True"

    def kind(record: LayerQk) -> Hashable:
        rotary = None if record.rotary is None else tuple(map(id, record.rotary))
        masked = None if record.mask is None else record.mask.dtype
        return (rotary, id(record.rotate), record.scaling, record.softcap, masked)

    found = []
    for group in grouped(run, heads, kind):
        keys, masks = [], []  # a layer's heads at once
        for layer, members in group.layers.items():
            key, mask = records[layer].key, records[layer].mask
            assert key is not None
            kv = index_on([g.kv_head(head) for _, head in members], key.device)
            keys.append(key[0, :, : last + 1][kv])
            if mask is not None:
                rows = [min(head, mask.shape[1] - 1) for _, head in members]
                row = records[layer].row(last)
                masks.append(mask[0, :, row, : last + 1][index_on(rows, mask.device)])
        record = group.record  # the group's scaling, soft-cap and rotary
        splits = score_splits(
            queries=group.last_queries(run),
            keys=torch.cat(keys) if len(keys) > 1 else keys[0],
            scaling=record.scaling,
            softcap=record.softcap,
            masks=(torch.cat(masks) if len(masks) > 1 else masks[0]) if masks else None,
            unrotate=unrotate_by(record),
        )
        found.append((group.indices, splits))
    return HeadScores(found)


#: Rotary-aware query views are made for at most this many labels, the nearest to the last
#: position (each is one more vocabulary projection per detailed head).
MAX_OFFSET_VIEWS = 4


def offset_labels(run: PromptRun) -> list[int]:
    """The label positions that get a rotary-aware query view: the MAX_OFFSET_VIEWS last."""
    return run.label_positions[-MAX_OFFSET_VIEWS:]


def offset_queries(run: PromptRun, layer: int, head: int, w_k: Tensor) -> Tensor | None:
    """W_K^⊤ R_Δ q for each of `offset_labels` (Δ = last − p): [P, D], None without rotary."""
    found = head_offset_queries(run, [(layer, head)], {layer: w_k[None]}, [0])
    return None if found is None else found[0]


def head_offset_queries(
    run: PromptRun,
    heads: list[tuple[int, int]],
    w_k: dict[int, Tensor],
    kv_index: Sequence[int] | None = None,
) -> Tensor | None:
    """`offset_queries` of each of `heads` [K, P, D], un-rotated once per shared rotary; None
    when any of them has no rotary (or no label). w_k per layer [n_kv, D, d]; `kv_index`: each
    head's K/V head within it (default: the geometry's)."""
    labels, g = offset_labels(run), run.loaded.geometry
    if not labels or not heads:
        return None
    kv = [g.kv_head(head) for _, head in heads] if kv_index is None else list(kv_index)
    records = [layer_qk(run, layer) for layer, _ in heads]
    if any(record is None or record.rotary is None for record in records):
        return None
    found, order = [], []  # each group's vectors, and the heads they belong to
    for group in grouped(run, heads, lambda r: (*map(id, r.rotary or ()), id(r.rotate))):
        unrotate = unrotate_by(group.record)
        assert unrotate is not None
        found.append(
            offset_queries_of(
                queries=group.last_queries(run),
                positions=labels,
                w_k=[w_k[heads[i][0]][kv[i]] for i in group.indices],
                unrotate=unrotate,
            )
        )
        order += group.indices
    vectors = torch.cat(found) if len(found) > 1 else found[0]
    if order == list(range(len(heads))):
        return vectors
    place = sorted(range(len(order)), key=order.__getitem__)  # head i's row
    return vectors[index_on(place, vectors.device)]


def real_queries(run: PromptRun, heads: list[tuple[int, int]], w_k: dict[int, Tensor]) -> Tensor:
    """W_K^⊤ q of each of `heads` at the last position, [K, D], q the model's real query (after
    any q-norm, before rotary): projected once per layer."""
    adapter, model, g = run.loaded.adapter, run.loaded.model, run.loaded.geometry
    at = run.cache.at(run.last)
    layer_queries: dict[int, Tensor] = {}
    queries = []
    for layer, head in heads:
        if layer not in layer_queries:
            x_hat = run.cache.normalized[layer, 0, at, None, None]  # [1, 1, D]
            with torch.inference_mode():
                every = adapter.project_qkv(model, layer, g, x_hat, x_hat)[0][0, 0]  # [H, d]
            layer_queries[layer] = to_device(every, x_hat.device).float()  # layers' devices
        query = layer_queries[layer][head]
        queries.append(to_device(w_k[layer][g.kv_head(head)], query.device) @ query)
    return gather(queries, run.cache.z.device)
