"""Experiment 2: the top-20 heads by mean log-probability increase over the correctly
answered prompts (paper Fig. 3/4), and their overlap with another dataset's top 20.

Increase of a head = I(head | resid_pre) for the true label token at the last position
(DESIGN.md); prompts use both label assignments.

Each top head's mean increase carries its bootstrap interval over prompts. Hypothesis: the top
20 lie in the deep half more often than the half of all heads that are deep; quantity: the
deep share of the top 20 minus 0.5, its interval from the same bootstrap (the top 20 re-ranked
in every resample of the prompts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from model_worker.common.defaults import DEFAULT_MAX_PROMPT_TOKENS
from model_worker.common.export_text import markdown_text
from model_worker.contracts.common import head_name
from model_worker.contracts.experiments import ExperimentResult
from model_worker.datasets import Dataset, load_builtin
from model_worker.experiments import paper, stats
from model_worker.experiments.batching import PromptRun, accuracy, prepare, run_prompts
from model_worker.experiments.context import Context, Row
from model_worker.experiments.data import PromptOptions, other_builtin, prompts
from model_worker.experiments.evidence import Evidence, adequacy
from model_worker.experiments.figure_data import bar_chart, heatmap
from model_worker.experiments.locate import ranked
from model_worker.experiments.progress import ProgressFn, Stages
from model_worker.experiments.report import comparison, header, pct, table
from model_worker.model.loading import LoadedModel

#: a statistic of per-head means [..., L·H] → [...]
Statistic = Callable[[NDArray[np.float64]], NDArray[np.float64]]
TOP = 20


def head_table(
    loaded: LoadedModel,
    dataset: Dataset,
    n: int,
    seed: int,
    *,
    batch_size: int,
    progress: ProgressFn,
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    options: PromptOptions | None = None,
) -> tuple[list[PromptRun], Tensor]:
    """Runs of `n` prompts (each within `max_tokens`, designed by `options`) and the [L, H]
    mean head increase over the correct ones."""
    found = prompts(dataset, n, seed) if options is None else prompts(dataset, n, seed, **options)
    items = prepare(loaded, found, max_tokens)
    runs = run_prompts(
        loaded,
        items,
        batch_size=batch_size,
        increases="correct",
        progress=progress,
        label=f"{dataset.name}: head increases",
    )
    tables = [r.increases for r in runs if r.increases is not None]
    g = loaded.geometry
    mean = torch.stack(tables).mean(0) if tables else torch.zeros(g.n_layers, g.n_heads)
    return runs, mean


def _rows(mean: Tensor, runs: Sequence[PromptRun], other: set[str]) -> list[Row]:
    tables = [r.increases for r in runs if r.increases is not None]
    sd = torch.stack(tables).std(0) if len(tables) > 1 else torch.zeros_like(mean)
    return [
        {
            "rank": rank + 1,
            "head": head_name(layer, head),
            "layer": layer,
            "mean_increase": float(mean[layer, head]),
            "sd": float(sd[layer, head]),
            "in_other_top20": "yes" if head_name(layer, head) in other else "no",
        }
        for rank, (layer, head) in enumerate(ranked(mean)[:TOP])
    ]


def run(ctx: Context) -> ExperimentResult:
    other_name = other_builtin(ctx.dataset)
    stages = Stages(ctx.progress, {"main": 1.0, "other": 1.0})
    common = {"batch_size": ctx.batch_size, "max_tokens": ctx.max_tokens}
    runs, mean = head_table(
        ctx.loaded,
        ctx.dataset,
        ctx.n,
        ctx.seed,
        progress=stages.stage("main"),
        options=ctx.prompt_options,
        **common,
    )
    other_runs, other_mean = head_table(
        ctx.loaded,
        load_builtin(other_name),
        ctx.n,
        ctx.seed,
        progress=stages.stage("other"),
        options=ctx.prompt_options,
        **common,
    )
    top = [head_name(*h) for h in ranked(mean)[:TOP]]
    other_top = [head_name(*h) for h in ranked(other_mean)[:TOP]]
    rows = _rows(mean, runs, set(other_top))
    other_rows = _rows(other_mean, other_runs, set(top))
    g = ctx.loaded.geometry
    deep = sum(int(r["layer"] or 0) >= g.n_layers // 2 for r in rows)
    overlap = len(set(top) & set(other_top))
    n_correct = sum(r.correct for r in runs)
    metrics = {
        "accuracy": accuracy(runs),
        "n_correct": float(n_correct),
        "top20_in_deep_layers": deep / len(rows) if rows else 0.0,
        "top20_mean_layer": sum(int(r["layer"] or 0) for r in rows) / max(1, len(rows)),
        "top20_overlap": float(overlap),
        "other_accuracy": accuracy(other_runs),
    }
    evidence = Evidence(adequacy=adequacy(runs, ctx.request.design))
    increases = [r.increases.flatten().tolist() for r in runs if r.increases is not None]
    other_increases = [
        r.increases.flatten().tolist() for r in other_runs if r.increases is not None
    ]
    if increases and other_increases:
        # the overlap's interval: both datasets' prompts resampled (each on its own), the top
        # 20 of each re-ranked in every resample
        k = min(TOP, g.n_layers * g.n_heads)
        share = stats.bootstrap_over_heads_two(increases, other_increases, stats.top_k_overlap(k))
        chance = stats.chance_overlap(k, g.n_layers * g.n_heads)
        evidence.add(f"top{TOP}_overlap_share", share)
        evidence.decide(
            f"the top {TOP} heads of {ctx.dataset.name} and {other_name} overlap more than "
            f"two random sets of {TOP} heads (chance share {chance:.3f})",
            f"top{TOP}_overlap_share_minus_chance",
            share.shifted(chance),
            min_effect=0.1,
        )
    if increases:
        draws = stats.resampled_means(increases, resamples=1000)  # [R, L·H]
        for row in rows:
            index = int(row["layer"] or 0) * g.n_heads + _head_index(str(row["head"]))
            low, high = np.percentile(draws[:, index], [2.5, 97.5])
            row["mean_increase_low"], row["mean_increase_high"] = float(low), float(high)
        deep_share = stats.bootstrap_over_heads(increases, _deep_share(g.n_heads, g.n_layers))
        evidence.decide(
            f"the top {TOP} heads lie in the deep half more often than half of them",
            "top20_deep_share_minus_half",
            deep_share.shifted(0.5),
            min_effect=0.1,
        )
    figures = {
        "top_heads": bar_chart(
            f"Top {TOP} heads by mean log-prob increase — {ctx.dataset.name}",
            [str(r["head"]) for r in rows],
            {"mean increase": [float(r["mean_increase"] or 0) for r in rows]},
            ylabel="log-prob increase",
            low={"mean increase": [float(r.get("mean_increase_low") or 0) for r in rows]},
            high={"mean increase": [float(r.get("mean_increase_high") or 0) for r in rows]},
        ),
        "other_top_heads": bar_chart(
            f"Top {TOP} heads by mean log-prob increase — {other_name}",
            [str(r["head"]) for r in other_rows],
            {"mean increase": [float(r["mean_increase"] or 0) for r in other_rows]},
            ylabel="log-prob increase",
        ),
        "increase_heatmap": heatmap(
            f"Mean head log-prob increase, {ctx.dataset.name} (layer × head)", mean.tolist()
        ),
    }
    report = "\n".join(
        [
            header(ctx, "Experiment 2 — where the in-context heads are (paper Fig. 3/4)"),
            f"Mean I(head | resid_pre) for the true label over the {n_correct} correctly "
            f"answered prompts of {len(runs)} (accuracy {pct(metrics['accuracy'])}); "
            f"{other_name}: {sum(r.correct for r in other_runs)} of {len(other_runs)}.\n",
            f"### Top {TOP} — {markdown_text(ctx.dataset.name)}\n",
            table(rows),
            f"\n### Top {TOP} — {markdown_text(other_name)}\n",
            table(other_rows),
            "",
            comparison(
                [
                    (
                        "top-20 heads in the deep half of the layers",
                        paper.HEADS_LAYERS,
                        f"{deep} of {len(rows)} in layers ≥ {g.n_layers // 2} of {g.n_layers}; "
                        f"mean layer {metrics['top20_mean_layer']:.1f}",
                    ),
                    (
                        "overlap of the top 20 between datasets",
                        "similar head indexes on both datasets",
                        f"{overlap} of {len(rows)} shared with {other_name}"
                        + _interval_text(evidence, f"top{TOP}_overlap_share"),
                    ),
                ]
            ),
        ]
    )
    return ctx.result(
        metrics, {"top_heads": rows, "other_top_heads": other_rows}, figures, report, evidence
    )


def _head_index(name: str) -> int:
    """The head index of `L{layer}H{head}`."""
    return int(name.split("H")[1])


def _interval_text(evidence: Evidence, name: str) -> str:
    """` (share 0.55 [0.4, 0.7], 95% prompt bootstrap)` of a recorded interval, or nothing."""
    found = evidence.intervals.get(name)
    if found is None:
        return ""
    return f" (share {found.text()}, 95% {found.method})"


def _deep_share(
    n_heads: int, n_layers: int
) -> Callable[[NDArray[np.float64]], NDArray[np.float64]]:
    """The statistic "share of the top TOP heads (by mean increase) in the deep half": per-head
    means [..., L·H] (layer-major) → [...]."""

    def share(means: NDArray[np.float64]) -> NDArray[np.float64]:
        top = np.argsort(-means, axis=-1, kind="stable")[..., :TOP] // n_heads
        return np.asarray((top >= n_layers // 2).mean(axis=-1), dtype=np.float64)

    return share
