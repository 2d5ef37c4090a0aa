"""Experiment `flow`: information flow per layer over the dataset (paper Fig. 1a; Wang et al.
2023, "Label words are anchors"), from the attention weights averaged over heads.

Per prompt and layer (definitions in model_worker/analysis/flow.py): the mean attention per
(destination, source) pair from each demonstration's tokens into its label position, from the
label positions into the last token, and of every other causal pair; averaged over prompts.
The paper's picture: shallow layers merge each demonstration into its label; deep layers move
the labels into the last token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from app.contracts import ExperimentResult
from app.figures.lines import Line, line_chart
from model_worker.analysis.flow import FLOWS, information_flow
from model_worker.capture import RunCache
from model_worker.experiments.batching import Batch, prepare, run_prompts
from model_worker.experiments.context import Context, Row
from model_worker.experiments.data import prompts
from model_worker.experiments.report import comparison, header, table
from model_worker.experiments.svg import PALETTE

NAMES = {
    "demo_to_label": "demonstrations → labels",
    "label_to_last": "labels → last token",
    "other": "other",
}
PAPER = (
    "shallow layers: demonstration → label flow dominates; deep layers: label → last-token "
    "flow dominates (Wang et al. 2023, GPT2-XL / GPT-J)"
)


def flows(batch: Batch, cache: RunCache) -> list[Tensor]:
    """Per row: [3, L] mean flows (FLOWS order) over its real tokens."""
    out = []
    for row, item in enumerate(batch.items):
        n = item.last + 1
        flow = information_flow(cache.pattern[:, row, :, :n, :n], list(item.label_positions))
        out.append(torch.stack([flow.mean[name] for name in FLOWS]))
    return out


def run(ctx: Context) -> ExperimentResult:
    items = prepare(ctx.loaded, prompts(ctx.dataset, ctx.n, ctx.seed))
    runs = run_prompts(
        ctx.loaded,
        items,
        batch_size=ctx.batch_size,
        extra=flows,
        progress=ctx.progress,
        label="information flow",
    )
    mean = torch.stack([r.extra for r in runs]).mean(0)  # [3, L]
    n_layers = mean.shape[1]
    rows: list[Row] = [
        {"layer": layer, **{name: float(mean[i, layer]) for i, name in enumerate(FLOWS)}}
        for layer in range(n_layers)
    ]
    half = n_layers // 2
    metrics: dict[str, float] = {}
    for i, name in enumerate(FLOWS):
        metrics[f"{name}_shallow"] = float(mean[i, :half].mean())
        metrics[f"{name}_deep"] = float(mean[i, half:].mean())
        metrics[f"{name}_peak_layer"] = float(mean[i].argmax())
    figure = line_chart(
        xs=list(range(n_layers)),
        lines=[
            Line(NAMES[name], PALETTE[i], [float(v) for v in mean[i]])
            for i, name in enumerate(FLOWS)
        ],
        title=f"Information flow per layer — {ctx.dataset.name} ({len(runs)} prompts)",
        figure="flow",
        x_label="layer",
        y_label="mean attention per pair",
    )

    def where(name: str) -> str:
        shallow, deep = metrics[f"{name}_shallow"], metrics[f"{name}_deep"]
        side = "shallow" if shallow > deep else "deep"
        return (
            f"{NAMES[name]}: {shallow:.3f} in layers < {half} vs {deep:.3f} in layers ≥ {half} "
            f"(larger in the {side} half; peak at layer {int(metrics[f'{name}_peak_layer'])})"
        )

    measured = "; ".join(where(name) for name in FLOWS[:2])
    report = "\n".join(
        [
            header(ctx, "Flow — information flow per layer (paper Fig. 1a)"),
            "Attention averaged over heads; each flow is the mean weight per (destination, "
            "source) pair of its set (definitions in `model_worker/analysis/flow.py`), "
            f"averaged over {len(runs)} prompts.\n",
            f"{measured}.\n",
            table(rows),
            "",
            comparison([("where each flow is strong", PAPER, measured)]),
        ]
    )
    return ctx.result(metrics, {"flow": rows}, {"flow": figure}, report)
