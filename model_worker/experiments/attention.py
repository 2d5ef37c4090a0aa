"""Experiment 4: attention from the last token to true vs false labels in the in-context heads
(paper Fig. 6), and attention weight vs log-probability increase of label subheadvalues in the
three in-context heads with the largest mean increase (Fig. 7; here over all prompts, not one).

Attention on true (false) labels = the last row of the head's pattern summed over the label
positions whose label is (is not) the input's true label. Subheadvalue increase =
I(a_p v_p W_O^h | resid_pre) for the true label token.

Hypothesis: the located heads attend more to true than to false labels. Quantity: per prompt,
the located heads' mean attention on true labels minus on false labels; bootstrap interval over
prompts, overall and per demonstration arrangement (under the paper's FFTT design the true
labels are also the nearest ones, so only the counterbalanced design separates the two).
Spearman's ρ carries a bootstrap interval over prompts (all of a prompt's points together).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from model_worker.analysis.contributions import logprob_increase
from model_worker.contracts.common import head_name
from model_worker.contracts.experiments import ExperimentResult
from model_worker.experiments import paper, stats
from model_worker.experiments.batching import Batch, Extra, PromptRun
from model_worker.experiments.context import Context, Row
from model_worker.experiments.evidence import Evidence, adequacy, by_arrangement
from model_worker.experiments.figure_data import bar_chart, scatter
from model_worker.experiments.locate import evaluated, locate_for, location_note
from model_worker.experiments.progress import Stages
from model_worker.experiments.report import comparison, header, table
from model_worker.experiments.values import Values
from model_worker.model.capture import RunCache
from model_worker.model.interventions import Head
from model_worker.model.loading import LoadedModel
from model_worker.run.state import final_projector

BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0001)


def subhead_increases(loaded: LoadedModel, heads: Sequence[Head]) -> Extra:
    """Per row: attention [K, P] and subheadvalue increases [K, P] of `heads` at label positions."""
    values = Values(loaded)

    def extra(batch: Batch, cache: RunCache) -> list[tuple[Tensor, Tensor]]:
        out = []
        for row, item in enumerate(batch.items):
            last, positions = item.last, list(item.label_positions)
            projector = final_projector(loaded, cache.resid_final[row, last], "fixed")
            vectors = torch.stack([values.weighted(cache, row, last, h, positions) for h in heads])
            bases = cache.resid_pre[[layer for layer, _ in heads], row, last]
            increase = logprob_increase(projector, bases, vectors, item.true_id).increase
            attention = torch.stack(
                [cache.pattern[layer, row, h, last, positions] for layer, h in heads]
            )
            out.append((attention.cpu(), increase.cpu()))
        return out

    return extra


def rank_correlation(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); 0.0 below three points."""
    if len(xs) < 3:
        return 0.0

    def ranks(values: Sequence[float]) -> Tensor:
        t = torch.tensor(values, dtype=torch.float64)
        return (t[:, None] > t[None, :]).sum(1) + ((t[:, None] == t[None, :]).sum(1) + 1) / 2

    rx, ry = ranks(xs).double(), ranks(ys).double()
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = float((rx.pow(2).sum() * ry.pow(2).sum()).sqrt())
    return float((rx * ry).sum()) / denominator if denominator else 0.0


def run(ctx: Context) -> ExperimentResult:
    stages = Stages(ctx.progress, {"locate": 2.0, "attend": 1.0})
    location = locate_for(ctx, stages.stage("locate"))
    top3 = sorted(location.heads, key=lambda h: -float(location.mean_increase[h]))[:3]
    runs = ctx.run_dataset(subhead_increases(ctx.loaded, top3), stages.stage("attend"), "attention")
    runs, scope = evaluated(ctx, runs)
    rows: list[Row] = []
    for layer, h in location.heads:
        true = [float(r.attn_true[layer, h]) for r in runs]
        false = [float(r.attn_false[layer, h]) for r in runs]
        true_interval = stats.bootstrap_mean(true)
        false_interval = stats.bootstrap_mean(false)
        rows.append(
            {
                "head": head_name(layer, h),
                "attn_true_mean": statistics.fmean(true),
                "attn_true_low": true_interval.low,
                "attn_true_high": true_interval.high,
                "attn_false_low": false_interval.low,
                "attn_false_high": false_interval.high,
                "attn_true_sd": statistics.pstdev(true),
                "attn_false_mean": statistics.fmean(false),
                "attn_false_sd": statistics.pstdev(false),
                "true_gt_false": sum(t > f for t, f in zip(true, false, strict=True)) / len(true),
            }
        )
    points: list[Row] = []
    for i, r in enumerate(runs):
        attention, increase = r.extra
        for k, head in enumerate(top3):
            for p, is_true in enumerate(r.item.label_true):
                points.append(
                    {
                        "prompt": i,
                        "head": head_name(*head),
                        "position": r.item.label_positions[p],
                        "is_true": "true" if is_true else "false",
                        "attention": float(attention[k, p]),
                        "increase": float(increase[k, p]),
                    }
                )
    true_points = [p for p in points if p["is_true"] == "true"]
    bins: list[Row] = []
    for low, high in zip(BINS, BINS[1:], strict=False):
        inside = [
            float(p["increase"] or 0)
            for p in true_points
            if low <= float(p["attention"] or 0) < high
        ]
        bins.append(
            {
                "attention_bin": f"{low:.1f}–{min(high, 1.0):.1f}",
                "n": len(inside),
                "mean_increase": statistics.fmean(inside) if inside else None,
            }
        )
    rho = rank_correlation(
        [float(p["attention"] or 0) for p in true_points],
        [float(p["increase"] or 0) for p in true_points],
    )
    metrics = {
        "attn_true": statistics.fmean(float(r["attn_true_mean"] or 0) for r in rows),
        "attn_false": statistics.fmean(float(r["attn_false_mean"] or 0) for r in rows),
        "true_gt_false": statistics.fmean(float(r["true_gt_false"] or 0) for r in rows),
        "spearman_attention_increase": rho,
    }
    evidence = Evidence(adequacy=adequacy(runs, ctx.request.design))

    def true_minus_false(r: PromptRun) -> float:
        return statistics.fmean(
            float(r.attn_true[head] - r.attn_false[head]) for head in location.heads
        )

    evidence.add(
        "attn_true", stats.bootstrap_mean([_located_mean(r, location.heads, True) for r in runs])
    )
    evidence.add(
        "attn_false", stats.bootstrap_mean([_located_mean(r, location.heads, False) for r in runs])
    )
    evidence.decide(
        "the located heads attend more to true labels than to false labels",
        "attn_true_minus_false",
        stats.bootstrap_mean([true_minus_false(r) for r in runs]),
        min_effect=0.02,
    )
    evidence.add("spearman_attention_increase", _rho_interval(true_points))
    arrangements = by_arrangement(evidence, runs, true_minus_false, "attn_true_minus_false")
    figures = {
        "attention": bar_chart(
            f"Last-token attention on true vs false labels — {ctx.dataset.name}",
            [str(r["head"]) for r in rows],
            {
                "true labels": [float(r["attn_true_mean"] or 0) for r in rows],
                "false labels": [float(r["attn_false_mean"] or 0) for r in rows],
            },
            ylabel="attention (sum)",
            low={
                "true labels": [float(r["attn_true_low"] or 0) for r in rows],
                "false labels": [float(r["attn_false_low"] or 0) for r in rows],
            },
            high={
                "true labels": [float(r["attn_true_high"] or 0) for r in rows],
                "false labels": [float(r["attn_false_high"] or 0) for r in rows],
            },
        ),
        "attention_vs_increase": scatter(
            "Attention vs log-prob increase of label subheadvalues "
            f"({', '.join(head_name(*h) for h in top3)})",
            {
                "true labels": [
                    (float(p["attention"] or 0), float(p["increase"] or 0)) for p in true_points
                ],
                "false labels": [
                    (float(p["attention"] or 0), float(p["increase"] or 0))
                    for p in points
                    if p["is_true"] == "false"
                ],
            },
            xlabel="attention weight",
            ylabel="log-prob increase",
        ),
    }
    report = "\n".join(
        [
            header(ctx, "Experiment 4 — attention on true vs false labels (Fig. 6, 7)"),
            location_note(location),
            f"Mean over in-context heads and {len(runs)} prompts ({scope}): attention on "
            "true labels "
            f"**{metrics['attn_true']:.3f}**, on false labels **{metrics['attn_false']:.3f}**; "
            f"true > false in {100 * metrics['true_gt_false']:.0f}% of (head, prompt) pairs.\n",
            table(rows),
            "\n### Per demonstration arrangement (true − false attention, located heads)\n",
            table(arrangements),
            "\n### Attention vs subheadvalue increase (true labels, top-3 in-context heads)\n",
            f"Spearman ρ = {rho:.3f} over {len(true_points)} (prompt, head, label) points.\n",
            table(bins),
            "",
            comparison(
                [
                    (
                        "attention on true vs false labels",
                        paper.ATTENTION,
                        f"{metrics['attn_true']:.3f} vs {metrics['attn_false']:.3f}",
                    ),
                    ("attention vs subheadvalue increase", paper.FIG7, f"Spearman ρ = {rho:.3f}"),
                ]
            ),
        ]
    )
    return ctx.result(
        metrics,
        {
            "attention": rows,
            "by_arrangement": arrangements,
            "subheadvalues": points,
            "bins": bins,
            "location": location.candidates,
        },
        figures,
        report,
        evidence,
    )


def _located_mean(run: PromptRun, heads: Sequence[Head], true: bool) -> float:
    """The mean over `heads` of the attention on the true (false) labels of one prompt."""
    table = run.attn_true if true else run.attn_false
    return statistics.fmean(float(table[head]) for head in heads)


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's ρ of continuous values (ranks by argsort; ties have measure zero)."""
    if len(x) < 3:
        return float("nan")
    rx = np.argsort(np.argsort(x)).astype(float)
    ry = np.argsort(np.argsort(y)).astype(float)
    rx -= rx.mean()
    ry -= ry.mean()
    denominator = float(np.sqrt((rx**2).sum() * (ry**2).sum()))
    return float((rx * ry).sum()) / denominator if denominator else float("nan")


def _rho_interval(points: Sequence[Row], resamples: int = 500) -> stats.Interval:
    """ρ(attention, increase) with a bootstrap interval over prompts (a prompt's points stay
    together); it keeps its prompts' points, so seeds pool (`stats.pool`)."""
    groups: dict[int, list[tuple[float, float]]] = {}
    for p in points:
        groups.setdefault(int(p["prompt"] or 0), []).append(
            (float(p["attention"] or 0), float(p["increase"] or 0))
        )
    if not groups:
        return stats.Interval(
            float("nan"), float("nan"), float("nan"), 0, "bootstrap", undefined="no prompts"
        )
    width = max(len(g) for g in groups.values())
    blocks = np.full((len(groups), width, 2), np.nan)  # [prompt, point, (attention, increase)]
    for i, g in enumerate(groups.values()):
        blocks[i, : len(g)] = g
    return _rho_of_blocks(blocks, resamples)


def _rho_of_blocks(blocks: np.ndarray, resamples: int = 500) -> stats.Interval:
    """`_rho_interval` of points [prompt, point, 2] (NaN-padded where a prompt has fewer):
    whole prompts resampled from a fixed seed."""
    rng = np.random.default_rng(stats.SEED)

    def rho(picked: np.ndarray) -> float:
        flat = picked.reshape(-1, 2)
        flat = flat[~np.isnan(flat).any(axis=1)]
        return _spearman(flat[:, 0], flat[:, 1])

    n = blocks.shape[0]
    draws = [rho(blocks[rng.integers(0, n, n)]) for _ in range(resamples)]
    sample = stats.Sample((blocks,), (0,), lambda joined: _rho_of_blocks(joined, resamples))
    return stats.from_draws(rho(blocks), draws, n, "bootstrap", sample=sample)
