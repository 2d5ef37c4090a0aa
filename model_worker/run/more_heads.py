"""More of a finished analysis, from one forward pass of its tokens, never a whole analysis: a
head detailed later, a detailed head's label-key tables, a head's score decomposition
(docs/towers.md). What the notebook's `result.head(name)` and a worker's on-demand head
requests compute.

The analysis' result holds what the rest needs: its tokens' ids, its labels, target and norm
(no prompt is read again), and every head's increase (`HeadSummary.increase`, the same fp32
numbers the analysis' details carry). A head's numbers are those of the whole analysis asked
for with the same options, to float precision (its random baseline head is drawn outside the
same studied heads).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from model_worker.contracts.analysis import AnalysisResult, HeadDetail
from model_worker.contracts.common import head_name
from model_worker.model.capture import KEEP_ALL, Keep, run_with_cache
from model_worker.model.loading import LoadedModel
from model_worker.model.prompting import ReadPrompt, parse_head_names
from model_worker.resources.gc_pause import without_gc
from model_worker.run.details import head_details, with_towers
from model_worker.run.state import PromptRun, final_projector
from model_worker.towers.run import detail_towers

Head = tuple[int, int]


def rerun(loaded: LoadedModel, result: AnalysisResult, k: int, keep: Keep) -> PromptRun:
    """One forward pass of `result`'s tokens, keeping `keep`, as the analysis' PromptRun
    (its target, labels and norm; `k` top tokens per view)."""
    read = ReadPrompt.of_result(result)
    with loaded.lock:
        cache = run_with_cache(
            loaded.model,
            loaded.adapter,
            loaded.geometry,
            read.encoded.ids[None].to(loaded.device),
            logits_to_keep=1,
            record_qk=True,
            keep=keep,
        )
    projector = final_projector(loaded, cache.resid_final[0, -1], result.norm)
    return PromptRun(loaded, cache, read, projector, result.target.id, k)


def keep_for(result: AnalysisResult, keys: bool, towers: bool) -> Keep:
    """The least a capture keeps for heads' details: the last position's residual stream and
    pattern row; the labels' too for label-key tables; everything for a decomposition (which
    reads every earlier layer at the scored positions)."""
    if towers:
        return KEEP_ALL
    last = len(result.tokens) - 1
    labels = {label.position for label in result.labels} if keys else set()
    return Keep(positions=tuple(sorted({*labels, last})), rows=(last,))


@without_gc
def compute_details(
    loaded: LoadedModel,
    result: AnalysisResult,
    heads: Sequence[Head],
    *,
    keyed: Sequence[Head] = (),
    decomposed: Sequence[Head] = (),
    towers_position: int | None = None,
    towers_versus: int | None = None,
    studied: Sequence[Head] | None = None,
    top_k_tokens: int = 10,
) -> list[HeadDetail]:
    """The details of `heads` of `result`'s analysis from one forward pass: with label-key
    tables for those in `keyed`, decomposed for those in `decomposed` (at `towers_position`
    minus `towers_versus`). `studied`: every head the analysis details (default: `heads`)."""
    if not heads:
        return []
    run = rerun(loaded, result, top_k_tokens, keep_for(result, bool(keyed), bool(decomposed)))
    g = loaded.geometry
    increases = torch.zeros(g.n_layers, g.n_heads, device=run.cache.z.device)
    for summary in result.heads:
        increases[summary.layer, summary.head] = summary.increase
    details = head_details(
        run,
        list(heads),
        increases,
        [h for h in keyed if h in heads],
        None if studied is None else list(studied),
    )
    return [
        with_towers(run, d, towers_position, towers_versus)
        if (d.layer, d.head) in decomposed
        else d
        for d in details
    ]


def with_label_keys(
    loaded: LoadedModel, result: AnalysisResult, name: str, top_k_tokens: int = 10
) -> HeadDetail:
    """Detailed head `name` of `result` with its label-key tables (`HeadDetail.keys`) computed
    from one forward pass, the rest of its detail as stored."""
    stored = result.head_details[name]
    if stored.keys is not None:
        return stored
    head = (stored.layer, stored.head)
    studied = [(d.layer, d.head) for d in result.head_details.values()]
    (found,) = compute_details(
        loaded, result, [head], keyed=[head], studied=studied, top_k_tokens=top_k_tokens
    )
    return stored.model_copy(update={"keys": found.keys})


def detail_more(
    loaded: LoadedModel,
    result: AnalysisResult,
    *,
    extra_heads: Sequence[str] = (),
    towers: Sequence[str] = (),
    towers_position: int | None = None,
    towers_versus: int | None = None,
    label_keys: Sequence[str] | Literal["all"] = (),
    top_k_tokens: int = 10,
) -> AnalysisResult:
    """What analysing `result`'s prompt again with these detail options gives (`analyze`'s
    `extra_heads`, `towers`, `label_keys`, the rest of its options as `result` was asked):
    the per-head stage as is, each detail that would come out the same kept, and only the
    others computed, from one forward pass. A detail is kept when its head keeps its label-key
    tables' state, is not decomposed, and its layer's studied heads (which its random baseline
    is drawn outside of) stay the same."""
    g = loaded.geometry
    extra = parse_head_names(list(extra_heads), g.n_layers, g.n_heads)
    decomposed = parse_head_names(list(towers), g.n_layers, g.n_heads)
    keyed: list[Head] = []
    if label_keys != "all":
        names = [label_keys] if isinstance(label_keys, str) else list(label_keys)
        keyed = parse_head_names(names, g.n_layers, g.n_heads)
    top = parse_head_names(result.top_heads, g.n_layers, g.n_heads)
    detailed = list(dict.fromkeys(top + extra + decomposed + keyed))
    if label_keys == "all":
        keyed = detailed
    before = {(d.layer, d.head): d for d in result.head_details.values()}

    def layer_heads(heads: Sequence[Head], layer: int) -> set[Head]:
        return {h for h in heads if h[0] == layer}

    def reusable(head: Head) -> HeadDetail | None:
        stored = before.get(head)
        if stored is None:
            return None
        if (stored.keys is not None) != (head in keyed):
            if stored.keys is None:
                return None
            stored = stored.model_copy(update={"keys": None})
        if layer_heads(detailed, head[0]) != layer_heads(list(before), head[0]):
            return None
        return stored.model_copy(update={"towers": []}) if stored.towers else stored

    kept = {head: reusable(head) for head in detailed}
    missing = [head for head in detailed if kept[head] is None]
    computed = compute_details(
        loaded,
        result,
        missing,
        keyed=[h for h in keyed if h in missing],
        decomposed=[h for h in decomposed if h in missing],
        towers_position=towers_position,
        towers_versus=towers_versus,
        studied=detailed,
        top_k_tokens=top_k_tokens,
    )
    found = {(d.layer, d.head): d for d in computed}
    redecomposed = [h for h in decomposed if h not in missing]  # details kept, towers anew
    found.update(
        decompose_kept(
            loaded,
            result,
            [kept[h] for h in redecomposed],  # type: ignore[misc]
            towers_position,
            towers_versus,
        )
    )
    details = {head_name(*head): found.get(head) or kept[head] for head in detailed}
    return result.model_copy(update={"head_details": details})


@without_gc
def decompose_kept(
    loaded: LoadedModel,
    result: AnalysisResult,
    kept: Sequence[HeadDetail],
    position: int | None,
    versus: int | None,
) -> dict[Head, HeadDetail]:
    """`kept` details (of heads `result` detailed) with their decompositions, from one forward
    pass that ends at the deepest of their layers: the decomposition reads no later layer, and
    the details are as stored."""
    if not kept:
        return {}
    ids = torch.tensor([token.id for token in result.tokens])
    with loaded.lock:
        cache = run_with_cache(
            loaded.model,
            loaded.adapter,
            loaded.geometry,
            ids[None].to(loaded.device),
            record_qk=True,
            through=max(d.layer for d in kept),
        )
    texts = [token.text for token in result.tokens]
    labels = [(label.position, label.is_true) for label in result.labels]
    return {
        (d.layer, d.head): d.model_copy(
            update={
                "towers": detail_towers(
                    loaded, cache, d.layer, d.head, texts, labels, position, versus
                )
            }
        )
        for d in kept
    }
