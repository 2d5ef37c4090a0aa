"""Experiment 3: MRR of the label tokens in the label-value projections of the in-context heads
vs random heads of the same layers (paper Fig. 5).

For each label position p of every prompt, the unweighted value v_p W_O^h is projected onto the
vocabulary (final norm frozen at the prompt's final residual, no biases: ranks do not depend on
that scale) and the rank of p's own label token ("foo" or "bar") taken. MRR per head and label
= mean 1/rank over all positions carrying that label. Each in-context head is compared with
random other heads of its layer, `DRAWS` draws of distinct heads (a draw never repeats a head:
model_worker/experiments/controls.py; the table's `random_head` is draw 1's), and with the mean
over all other non-located heads of that layer.

Hypothesis: the located heads' label values rank the labels higher than random heads of the
same layers. Quantity: per prompt, the located heads' mean reciprocal rank (over heads and
label positions) minus the same for the random draws (mean over draws); paired bootstrap
interval over prompts. Every MRR carries its bootstrap interval over prompts.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch
from torch import Tensor

from model_worker.analysis.metrics import mean_reciprocal_rank, rank_of
from model_worker.contracts.common import head_name
from model_worker.contracts.experiments import ExperimentResult
from model_worker.experiments import paper, stats
from model_worker.experiments.batching import Batch, Extra
from model_worker.experiments.context import Context, Row
from model_worker.experiments.controls import DRAWS, same_layer_draws
from model_worker.experiments.evidence import Evidence, adequacy, interval_columns
from model_worker.experiments.figure_data import bar_chart
from model_worker.experiments.locate import evaluated, locate_for, location_note
from model_worker.experiments.progress import Stages
from model_worker.experiments.report import comparison, header, table
from model_worker.experiments.values import Values
from model_worker.model.capture import RunCache
from model_worker.model.interventions import Head
from model_worker.model.loading import LoadedModel
from model_worker.run.state import final_projector


def label_ranks(loaded: LoadedModel, layers: Sequence[int]) -> Extra:
    """Per row: ranks [len(layers), H, P] of each label position's own token in v_p W_O^h of
    every head of `layers`, and the label token ids [P]."""
    values = Values(loaded)
    heads = list(range(loaded.geometry.n_heads))

    def extra(batch: Batch, cache: RunCache) -> list[tuple[Tensor, Tensor]]:
        out = []
        for row, item in enumerate(batch.items):
            positions = list(item.label_positions)
            ids = item.ids[positions].to(cache.v.device)
            vectors = torch.stack(
                [values.at(cache, row, item.last, la, heads, positions) for la in layers]
            )
            projector = final_projector(loaded, cache.resid_final[row, item.last], "fixed")
            logits = projector.project(vectors)  # [nL, H, P, V]
            reference = logits.gather(-1, ids.expand(*logits.shape[:-1])[..., None])
            out.append((rank_of(logits, reference).cpu(), ids.cpu()))
        return out

    return extra


def run(ctx: Context) -> ExperimentResult:
    stages = Stages(ctx.progress, {"locate": 2.0, "project": 1.0})
    location = locate_for(ctx, stages.stage("locate"))
    g = ctx.loaded.geometry
    layers = sorted({layer for layer, _ in location.heads})
    runs = ctx.run_dataset(
        label_ranks(ctx.loaded, layers), stages.stage("project"), "label-value projections"
    )
    runs, scope = evaluated(ctx, runs)
    # ranks[(layer, head)][token id] → list of ranks
    ranks: dict[Head, dict[int, list[int]]] = {}
    for r in runs:
        table_ranks, ids = r.extra
        for i, layer in enumerate(layers):
            for h in range(g.n_heads):
                per = ranks.setdefault((layer, h), {})
                for p, token in enumerate(ids.tolist()):
                    per.setdefault(token, []).append(int(table_ranks[i, h, p]))
    tokens = sorted({t for per in ranks.values() for t in per})
    rows: list[Row] = []
    draws = same_layer_draws(location.heads, g.n_heads, ctx.seed, DRAWS)
    partners = {head: draws[0][k] for k, head in enumerate(location.heads) if k < len(draws[0])}

    def per_prompt(heads: list[Head], token: int | None = None) -> list[float]:
        """Each prompt's mean reciprocal rank over `heads` and its label positions (of
        `token` only, if given)."""
        out = []
        for r in runs:
            table_ranks, ids = r.extra
            keep = [p for p, t in enumerate(ids.tolist()) if token is None or t == token]
            values = [
                1.0 / float(table_ranks[layers.index(la), h, p]) for la, h in heads for p in keep
            ]
            out.append(statistics.fmean(values) if values else 0.0)
        return out

    for head in location.heads:
        partner = partners.get(head)
        layer_others = [
            (head[0], o) for o in range(g.n_heads) if (head[0], o) not in location.heads
        ]
        for token in tokens:
            own = ranks[head].get(token, [])
            rows.append(
                {
                    "head": head_name(*head),
                    "label": ctx.loaded.token_text(token),
                    "mrr": mean_reciprocal_rank(own),
                    **{
                        f"mrr_{side}": getattr(
                            stats.bootstrap_mean(per_prompt([head], token)), side
                        )
                        for side in ("low", "high")
                    },
                    "median_rank": float(torch.tensor(own).float().median()) if own else None,
                    "random_head": head_name(*partner) if partner is not None else None,
                    "random_mrr": mean_reciprocal_rank(ranks[partner].get(token, []))
                    if partner is not None
                    else None,
                    "layer_other_heads_mrr": sum(
                        mean_reciprocal_rank(ranks[o].get(token, [])) for o in layer_others
                    )
                    / len(layer_others)
                    if layer_others
                    else None,
                }
            )
    located = [float(r["mrr"] or 0) for r in rows]
    randoms = [float(r["random_mrr"]) for r in rows if r["random_mrr"] is not None]
    layer_means = [float(r["layer_other_heads_mrr"]) for r in rows if r["layer_other_heads_mrr"]]
    metrics = {
        "mrr_in_context": sum(located) / max(1, len(located)),
        "mrr_random": sum(randoms) / max(1, len(randoms)),
        "mrr_layer_others": sum(layer_means) / max(1, len(layer_means)),
        "min_mrr_in_context": min(located, default=0.0),
    }
    evidence = Evidence(adequacy=adequacy(runs, ctx.request.design))
    located_prompts = per_prompt(list(location.heads))
    evidence.add("mrr_located", stats.bootstrap_mean(located_prompts))
    draw_prompts = [per_prompt(draw) for draw in draws if draw]
    draw_rows: list[Row] = []
    for d, (draw, values) in enumerate(zip([d for d in draws if d], draw_prompts, strict=True)):
        found = evidence.add(f"mrr_random_draw{d + 1}", stats.bootstrap_mean(values))
        draw_rows.append(
            {
                "draw": d + 1,
                "heads": " ".join(head_name(*h) for h in draw),
                **interval_columns("mrr", found),
            }
        )
    if draw_prompts:
        random_mean = [statistics.fmean(column) for column in zip(*draw_prompts, strict=True)]
        evidence.add("mrr_random_draws", stats.bootstrap_mean(random_mean))
        evidence.decide(
            "the located heads' label values rank the labels higher than random heads of the "
            "same layers",
            "mrr_located_minus_random",
            stats.bootstrap_diff(located_prompts, random_mean, paired=True),
            min_effect=0.01,
        )
    names = [f"{r['head']} {str(r['label']).strip()}" for r in rows]
    figure = bar_chart(
        f"MRR of label tokens in label values — {ctx.dataset.name}",
        names,
        {
            "in-context head": located,
            "random head, same layer": [float(r["random_mrr"] or 0) for r in rows],
            "other heads of the layer (mean)": [
                float(r["layer_other_heads_mrr"] or 0) for r in rows
            ],
        },
        ylabel="MRR",
        low={"in-context head": [float(r["mrr_low"] or 0) for r in rows]},
        high={"in-context head": [float(r["mrr_high"] or 0) for r in rows]},
    )
    ratio = metrics["mrr_in_context"] / metrics["mrr_random"] if metrics["mrr_random"] else 0.0
    report = "\n".join(
        [
            header(ctx, "Experiment 3 — label-value MRR, in-context vs random heads (Fig. 5)"),
            location_note(location),
            f"Over {len(runs)} prompts ({scope}), every label position. Mean MRR: in-context "
            f"**{metrics['mrr_in_context']:.4f}**, random same-layer heads "
            f"{metrics['mrr_random']:.4f}, all other heads of those layers "
            f"{metrics['mrr_layer_others']:.4f}.\n",
            table(rows),
            f"\n### Random same-layer heads: {len(draw_rows)} draws of distinct heads\n",
            table(draw_rows),
            "",
            comparison(
                [
                    (
                        "label-value MRR, in-context vs random heads",
                        paper.MRR,
                        f"{metrics['mrr_in_context']:.4f} vs {metrics['mrr_random']:.4f} "
                        f"(×{ratio:.1f}); smallest in-context {metrics['min_mrr_in_context']:.4f}",
                    )
                ]
            ),
        ]
    )
    return ctx.result(
        metrics,
        {"mrr": rows, "random_draws": draw_rows, "location": location.candidates},
        {"mrr": figure},
        report,
        evidence,
    )
