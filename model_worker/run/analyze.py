"""`analyze()`: locate-and-project on one prompt → an AnalysisResult (DESIGN.md, "Analysis
definitions"), in the method's order: capture the prompt; project at its last position; every
layer's and head's log-probability increase (the per-head stage: heatmap and top heads); then
the top heads' per-position contributions and vocabulary views (the details)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Literal

import torch

from model_worker.analysis.heads import (
    LabelSplit,
    attention_sums,
    head_increases,
    head_writes,
    label_split,
)
from model_worker.checks.result_warnings import analysis_warnings
from model_worker.common.defaults import DEFAULT_MAX_PROMPT_TOKENS
from model_worker.contracts.analysis import AnalysisResult
from model_worker.contracts.caveats import ResultWarning
from model_worker.contracts.common import NormMode, RankBy
from model_worker.model.capture import KEEP_ALL, Keep, run_with_cache
from model_worker.model.loading import LoadedModel
from model_worker.model.prompting import parse_head_names, read_prompt, target_id
from model_worker.resources.gc_pause import without_gc
from model_worker.run.answer import answer_check
from model_worker.run.assembly import head_summaries, heads_stage_result, target_info
from model_worker.run.details import head_details, with_towers
from model_worker.run.state import PromptRun, final_projector


@without_gc
def analyze(
    loaded: LoadedModel,
    prompt: str,
    *,
    target: str | None = None,
    labels: list[str] | None = None,
    expected: str | None = None,
    norm: NormMode = "fixed",
    top_k_heads: int = 20,
    top_k_tokens: int = 10,
    extra_heads: list[str] | None = None,
    towers: list[str] | None = None,
    towers_position: int | None = None,
    towers_versus: int | None = None,
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    rank_by: RankBy = "increase",
    on_heads: Callable[[AnalysisResult], None] | None = None,
    label_keys: Sequence[str] | Literal["all"] = (),
) -> AnalysisResult:
    """Locate-and-project on `prompt` at its last position (DESIGN.md, "Analysis definitions").

    `expected`: the right answer, when known: `answer` says whether the prediction is it
    (without it, a query that repeats a demonstration's input takes that label as the answer).
    `rank_by="label"` ranks the heads (and picks the detailed top K) by their label increase.
    Two stages: the tokens, layer and per-head increases (what the heatmap and the top-heads
    table need), then the details of the top and extra heads. `on_heads`, if given, receives
    the first stage's result (`head_details` empty) before the details are computed.
    `towers`: heads (detailed too) whose score is decomposed into the two towers (docs/towers.md),
    at `towers_position` and minus `towers_versus` (defaults: see `model_worker.towers.run`).
    `label_keys`: heads (detailed too) whose label-key tables (`HeadDetail.keys`) are computed,
    or "all" for every detailed head's; the others' `keys` are None (on demand: ~44% of the
    details' products at 512 tokens, read only when a head's tables are opened).

    Raises a UserInputError subclass with one clear line for bad input.
    """
    g = loaded.geometry
    extra = parse_head_names(extra_heads or [], g.n_layers, g.n_heads)
    decomposed = parse_head_names(towers or [], g.n_layers, g.n_heads)
    keyed = []
    if label_keys != "all":  # one name alone is read as a list of one
        names = [label_keys] if isinstance(label_keys, str) else list(label_keys)
        keyed = parse_head_names(names, g.n_layers, g.n_heads)
    read = read_prompt(loaded, prompt, labels, max_tokens)  # the one reading of the prompt
    last_position, label_positions = read.last_position, read.label_positions
    # what the analysis reads, linear in the prompt: the last row of each pattern, the flow
    # sums, the residual stream at the last position and, where label-key tables are asked
    # for, at the labels (towers read everything)
    keep = KEEP_ALL
    if not decomposed:
        at_labels = label_positions if label_keys == "all" or keyed else ()
        positions = tuple(sorted({*at_labels, last_position}))
        keep = Keep(positions=positions, rows=(last_position,), flow_labels=label_positions)
    with loaded.lock:
        ids = read.encoded.ids[None].to(loaded.device)
        cache = run_with_cache(
            loaded.model, loaded.adapter, g, ids, logits_to_keep=1, record_qk=True, keep=keep
        )
    logprobs = torch.log_softmax(cache.logits[0, -1], -1)  # the last position's
    warnings: list[ResultWarning] = []
    if target is None:
        target_token = int(logprobs.argmax())
    else:
        target_token, warnings = target_id(loaded, prompt, target, read.reading)
    projector = final_projector(loaded, cache.resid_final[0, -1], norm)
    run = PromptRun(loaded, cache, read, projector, target_token, top_k_tokens)

    # the per-head stage: I(head_{l,h} | resid_pre_l) of every head, ranked
    c, last, row = cache, cache.at(run.last), cache.row(run.last)
    resid_pre = c.resid_pre[:, 0, last]
    writes = head_writes(
        z=c.z[:, 0, last] * c.attn_scale[:, 0, last],
        v=c.v[:, 0],
        pattern_row=c.pattern[:, 0, :, row],
        attn_scale=c.attn_scale[:, 0, last],
        w_o=(run.w_o(layer) for layer in range(g.n_layers)),  # a layer's fp32 copy at a time
        kv_index=run.kv_index(),
        label_positions=run.label_positions,
    )
    increases = head_increases(
        projector=projector,
        resid_pre=resid_pre,
        writes=writes,
        target=target_token,
        pre_logits=run.pre_logits,
    )

    def split_by_label() -> LabelSplit:
        nonlocal increases
        found = label_split(
            projector=projector,
            resid_pre=resid_pre,
            writes=writes,
            whole=increases,
            target=target_token,
            pre_logits=run.pre_logits,
        )
        # the whole heads' kept logits were consumed as scratch: freed before the details
        increases = replace(increases, logits=None)
        return found

    split = split_by_label() if rank_by == "label" else None  # else after the per-head stage
    attn_true, attn_false = attention_sums(
        pattern_row=c.pattern[:, 0, :, row],
        true_positions=[p for p in run.label_positions if run.is_true(p)],
        false_positions=[p for p in run.label_positions if not run.is_true(p)],
    )
    ranking = increases.increase if split is None else split.label
    order = ranking.flatten().argsort(descending=True).tolist()
    columns = {"increase": increases.increase, "attn_true": attn_true, "attn_false": attn_false}
    summaries = head_summaries(g.n_heads, order, columns, split)
    top = [(s.layer, s.head) for s in summaries[:top_k_heads]]
    heads_stage = heads_stage_result(
        run,
        norm=norm,
        rank_by=rank_by,
        target=target_info(run, logprobs, given=target is not None),
        summaries=summaries,
        top=top,
        warnings=warnings,
    )
    checked = [*analysis_warnings(heads_stage), *heads_stage.warnings]
    answer = answer_check(loaded, read, logprobs, expected)
    heads_stage = heads_stage.model_copy(update={"warnings": checked, "answer": answer})
    if on_heads is not None:
        on_heads(heads_stage)

    # the details of the top (and extra) heads
    if split is None:
        summaries = head_summaries(g.n_heads, order, columns, split_by_label())
    detailed = list(dict.fromkeys(top + extra + decomposed + keyed))
    details = head_details(
        run, detailed, increases.increase, detailed if label_keys == "all" else keyed
    )
    details = [
        with_towers(run, d, towers_position, towers_versus)
        if (d.layer, d.head) in decomposed
        else d
        for d in details
    ]
    return heads_stage.model_copy(
        update={"heads": summaries, "head_details": {d.name: d for d in details}}
    )
