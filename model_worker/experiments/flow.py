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

from model_worker.analysis.flow import FLOWS, information_flow
from model_worker.capture import RunCache
from model_worker.contracts import ExperimentResult
from model_worker.experiments.batching import Batch
from model_worker.experiments.context import Context, Row
from model_worker.experiments.figure_data import line_chart
from model_worker.experiments.report import comparison, header, table

#: legend name of each column: the flows as on the dashboard, then the two shares
SERIES = {
    "demo_to_label": "demonstrations → labels",
    "label_to_last": "labels → last token",
    "other": "other",
    "demo_to_label_share": "share: demonstration → its label",
    "label_to_last_share": "share: labels → last token",
}
PAPER = (
    "shallow layers: demonstration → label flow dominates; deep layers: label → last-token "
    "flow dominates (Wang et al. 2023, GPT2-XL / GPT-J)"
)


def flows(batch: Batch, cache: RunCache) -> list[Tensor]:
    """Per row: [5, L]: the mean flows (FLOWS order) over its real tokens, then the share of
    a label position's attention on its own demonstration (mean over labels) and the share of
    the last token's attention on the label positions."""
    out = []
    for row, item in enumerate(batch.items):
        n, labels = item.last + 1, list(item.label_positions)
        flow = information_flow(cache.pattern[:, row, :, :n, :n], labels)
        shares = [flow.mass["demo_to_label"] / max(1, len(labels)), flow.mass["label_to_last"]]
        out.append(torch.stack([*(flow.mean[name] for name in FLOWS), *shares]))
    return out


def run(ctx: Context) -> ExperimentResult:
    runs = ctx.run_dataset(flows, ctx.progress, "information flow")
    mean = torch.stack([r.extra for r in runs]).mean(0)  # [5, L]: the 3 flows, 2 shares
    n_layers = mean.shape[1]
    columns = [*FLOWS, "demo_to_label_share", "label_to_last_share"]
    rows: list[Row] = [
        {"layer": layer, **{name: float(mean[i, layer]) for i, name in enumerate(columns)}}
        for layer in range(n_layers)
    ]
    half = n_layers // 2
    metrics: dict[str, float] = {}
    for i, name in enumerate(columns):
        metrics[f"{name}_shallow"] = float(mean[i, :half].mean())
        metrics[f"{name}_deep"] = float(mean[i, half:].mean())
        metrics[f"{name}_peak_layer"] = float(mean[i].argmax())
    figures = {
        figure: line_chart(
            f"{title} — {ctx.dataset.name} ({len(runs)} prompts)",
            list(range(n_layers)),
            {
                SERIES[name]: [float(v) for v in mean[i]]
                for i, name in enumerate(columns)
                if i in picked
            },
            xlabel="layer",
            ylabel=y_label,
        )
        for figure, picked, title, y_label in (
            ("flow", (0, 1, 2), "Information flow per layer", "mean attention per pair"),
            ("flow_shares", (3, 4), "Share of attention per layer", "share of the row"),
        )
    }

    def where(name: str) -> str:
        shallow, deep = metrics[f"{name}_shallow"], metrics[f"{name}_deep"]
        side = "shallow" if shallow > deep else "deep"
        return (
            f"{SERIES[name]}: {shallow:.3f} in layers < {half} vs {deep:.3f} in layers ≥ {half} "
            f"(larger in the {side} half; peak at layer {int(metrics[f'{name}_peak_layer'])})"
        )

    measured = "; ".join(where(name) for name in FLOWS[:2])
    shares = (
        f"share of a label position's attention on its own demonstration: "
        f"{metrics['demo_to_label_share_shallow']:.3f} (layers < {half}) vs "
        f"{metrics['demo_to_label_share_deep']:.3f}; share of the last token's attention on "
        f"the labels: {metrics['label_to_last_share_shallow']:.3f} vs "
        f"{metrics['label_to_last_share_deep']:.3f} (peak layer "
        f"{int(metrics['label_to_last_share_peak_layer'])})"
    )
    report = "\n".join(
        [
            header(ctx, "Flow — information flow per layer (paper Fig. 1a)"),
            "Attention averaged over heads; each flow is the mean weight per (destination, "
            "source) pair of its set (definitions in `model_worker/analysis/flow.py`), "
            f"averaged over {len(runs)} prompts. Per-pair means favour short rows (an early "
            "token spreads its attention over few sources), so the shares of a row's attention "
            "are given too.\n",
            f"{measured}.\n",
            f"Shares: {shares}.\n",
            table(rows),
            "",
            comparison([("where each flow is strong", PAPER, f"{measured}; {shares}")]),
        ]
    )
    return ctx.result(metrics, {"flow": rows}, figures, report)
