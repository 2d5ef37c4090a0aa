"""What a head scored with: its recorded pre-softmax scores split into content and position,
and its real query reverse-projected into the residual space (rotary-aware per label offset)."""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from model_worker.analysis.scores import ScoreSplit, Unrotate, rotary_offset_queries, score_split
from model_worker.device_memory import gather, to_device
from model_worker.qk import LayerQk, rotate
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


def head_scores(run: PromptRun, layer: int, head: int) -> ScoreSplit | None:
    """The last position's pre-softmax scores of `head`, split into content and position."""
    record, last = layer_qk(run, layer), run.last
    if record is None or record.query is None or record.key is None:
        return None
    mask, row = None, record.row(last)
    if record.mask is not None:
        mask = record.mask[0, min(head, record.mask.shape[1] - 1), row, : last + 1]
    return score_split(
        query=record.query[0, head, row],
        keys=record.key[0, run.loaded.geometry.kv_head(head), : last + 1],
        scaling=record.scaling,
        softcap=record.softcap,
        mask=mask,
        unrotate=unrotate_by(record),
    )


#: Rotary-aware query views are made for at most this many labels, the nearest to the last
#: position (each is one more vocabulary projection per detailed head).
MAX_OFFSET_VIEWS = 4


def offset_labels(run: PromptRun) -> list[int]:
    """The label positions that get a rotary-aware query view: the MAX_OFFSET_VIEWS last."""
    return run.label_positions[-MAX_OFFSET_VIEWS:]


def offset_queries(run: PromptRun, layer: int, head: int, w_k: Tensor) -> Tensor | None:
    """W_K^⊤ R_Δ q for each of `offset_labels` (Δ = last − p): [P, D], None without rotary."""
    record, labels = layer_qk(run, layer), offset_labels(run)
    if record is None or record.query is None or not labels:
        return None
    unrotate = unrotate_by(record)
    if unrotate is None:
        return None
    query = record.query[0, head, record.row(run.last)]
    return rotary_offset_queries(query=query, positions=labels, w_k=w_k, unrotate=unrotate)


def real_queries(run: PromptRun, heads: list[tuple[int, int]], w_k: dict[int, Tensor]) -> Tensor:
    """W_K^⊤ q of each of `heads` at the last position, [K, D], q the model's real query (after
    any q-norm, before rotary)."""
    adapter, model, g = run.loaded.adapter, run.loaded.model, run.loaded.geometry
    queries = []
    for layer, head in heads:
        x_hat = run.cache.normalized[layer, 0, run.cache.at(run.last), None, None]  # [1, 1, D]
        with torch.inference_mode():
            query = adapter.project_qkv(model, layer, g, x_hat, x_hat)[0][0, 0, head]
        query = to_device(query, x_hat.device).float()  # layers may sit on several devices
        queries.append(to_device(w_k[layer][g.kv_head(head)], query.device) @ query)
    return gather(queries, run.cache.z.device)
