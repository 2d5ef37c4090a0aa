"""Experiment `flow`: information flow per layer over the dataset (paper Fig. 1a; Wang et al.
2023, "Label words are anchors"), from the attention weights averaged over heads.

Per prompt and layer (definitions in model_worker/analysis/flow.py): the mean attention per
(destination, source) pair from each demonstration's tokens into its label position, from the
label positions into the last token, and of every other causal pair; averaged over prompts.
The paper's picture: shallow layers merge each demonstration into its label; deep layers move
the labels into the last token.

Beside these, two versions that survive the attention sink (model_worker/analysis/flow_sink.py):
the same pair sets without token 0 as a source, with the sink's share reported apart, from
(a) the head-averaged attention and (b) Wang et al.'s saliency |Σ_h A_h ⊙ ∂L/∂A_h|
(model_worker/experiments/saliency.py; L = −log p(true label)). Every per-layer value carries a
bootstrap interval over prompts; the hypotheses (demonstrations → labels stronger in the
shallow half, labels → last token stronger in the deep half) are decided on the per-prompt
difference of the two halves' means, for both sink-free versions.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from model_worker.analysis.flow import FLOWS, information_flow
from model_worker.analysis.flow_sink import COLUMNS, sinkless_flow
from model_worker.contracts.experiments import ExperimentResult
from model_worker.experiments import stats
from model_worker.experiments.batching import Batch, PromptRun, make_batches
from model_worker.experiments.context import Context, Row
from model_worker.experiments.evidence import Evidence, adequacy, interval_columns
from model_worker.experiments.figure_data import line_chart
from model_worker.experiments.progress import Stages
from model_worker.experiments.report import comparison, header, table
from model_worker.experiments.saliency import saliency
from model_worker.model.capture import RunCache

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
    """Per row: [10, L]: the mean flows (FLOWS order) over its real tokens, then the share of
    a label position's attention on its own demonstration (mean over labels) and the share of
    the last token's attention on the label positions; then the sink-free flows and the sink
    shares of the head-averaged attention (flow_sink.COLUMNS)."""
    out = []
    for row, item in enumerate(batch.items):
        n, labels = item.last + 1, list(item.label_positions)
        pattern = cache.pattern[:, row, :, :n, :n]
        flow = information_flow(pattern, labels)
        shares = [flow.mass["demo_to_label"] / max(1, len(labels)), flow.mass["label_to_last"]]
        sinkless = sinkless_flow(pattern.float().mean(1), labels)
        attention = torch.stack([*(flow.mean[name] for name in FLOWS), *shares])
        out.append(torch.cat([attention, sinkless]))
    return out


def saliency_flows(ctx: Context, runs: list[PromptRun]) -> Tensor:
    """[N, 5, L]: the sink-free flows and sink shares of each prompt's saliency matrix."""
    pad_id = ctx.loaded.tokenizer.pad_token_id or 0
    out = []
    items = [r.item for r in runs]
    for batch in make_batches(items, ctx.batch_size, pad_id):
        matrices = saliency(ctx.loaded, batch)
        for row, item in enumerate(batch.items):
            n = item.last + 1
            out.append(sinkless_flow(matrices[row, :, :n, :n], list(item.label_positions)))
        ctx.progress(len(out) / max(1, len(items)), f"saliency: {len(out)}/{len(items)}")
    return torch.stack(out)


def run(ctx: Context) -> ExperimentResult:
    stages = Stages(ctx.progress, {"attention": 1.0, "saliency": 3.0})
    runs = ctx.run_dataset(flows, stages.stage("attention"), "information flow")
    per_prompt = torch.cat(
        [
            torch.stack([r.extra for r in runs]),
            saliency_flows(replace(ctx, progress=stages.stage("saliency")), runs),
        ],
        dim=1,
    )  # [N, 15, L]
    mean = per_prompt.mean(0)  # the 3 flows, 2 shares, then sink-free attention, saliency
    n_layers = mean.shape[1]
    columns = [*FLOWS, "demo_to_label_share", "label_to_last_share"]
    sinkless_names = [f"{c}_nosink" for c in COLUMNS] + [f"saliency_{c}" for c in COLUMNS]
    rows: list[Row] = [
        {"layer": layer, **{name: float(mean[i, layer]) for i, name in enumerate(columns)}}
        for layer in range(n_layers)
    ]
    flat = per_prompt.reshape(per_prompt.shape[0], -1).double().numpy()
    bounds = stats.bootstrap_means(flat)  # per (column, layer)
    for j, name in enumerate(sinkless_names):
        for layer in range(n_layers):
            found = bounds[(len(columns) + j) * n_layers + layer]
            rows[layer].update(interval_columns(name, found))
    half = n_layers // 2
    metrics: dict[str, float] = {}
    for i, name in enumerate(columns):
        metrics[f"{name}_shallow"] = float(mean[i, :half].mean())
        metrics[f"{name}_deep"] = float(mean[i, half:].mean())
        metrics[f"{name}_peak_layer"] = float(mean[i].argmax())
    evidence = Evidence(adequacy=adequacy(runs, ctx.request.design))
    for j, name in enumerate(sinkless_names):
        values = per_prompt[:, len(columns) + j]  # [N, L]
        shallow_values, deep_values = values[:, :half].mean(1), values[:, half:].mean(1)
        metrics[f"{name}_shallow"] = float(shallow_values.mean())
        metrics[f"{name}_deep"] = float(deep_values.mean())
        evidence.add(f"{name}_shallow", stats.bootstrap_mean(shallow_values.tolist()))
        evidence.add(f"{name}_deep", stats.bootstrap_mean(deep_values.tolist()))
        if name.endswith(("demo_to_label_nosink", "demo_to_label")) and "sink_" not in name:
            evidence.decide(
                f"{name}: demonstrations → labels is stronger in the shallow half",
                f"{name}_shallow_minus_deep",
                stats.bootstrap_mean((shallow_values - deep_values).tolist()),
            )
        if name.endswith(("label_to_last_nosink", "label_to_last")) and "sink_" not in name:
            evidence.decide(
                f"{name}: labels → last token is stronger in the deep half",
                f"{name}_deep_minus_shallow",
                stats.bootstrap_mean((deep_values - shallow_values).tolist()),
            )
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
    for figure, prefix, y_label in (
        ("flow_nosink", "", "mean attention per pair, token 0 excluded"),
        ("flow_saliency", "saliency_", "mean saliency per pair, token 0 excluded"),
    ):
        named = [(SERIES[c], f"{prefix}{c}" + ("" if prefix else "_nosink")) for c in FLOWS]

        def column(key: str, suffix: str = "") -> list[float]:
            return [float(r[f"{key}{suffix}"] or 0) for r in rows]

        figures[figure] = line_chart(
            f"{y_label.capitalize()} — {ctx.dataset.name} ({len(runs)} prompts)",
            list(range(n_layers)),
            {legend: column(key) for legend, key in named},
            xlabel="layer",
            ylabel=y_label,
            low={legend: column(key, "_low") for legend, key in named},
            high={legend: column(key, "_high") for legend, key in named},
        )

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
            "Without the sink (token 0 excluded as a source; its share apart): "
            f"demonstrations → labels {metrics['demo_to_label_nosink_shallow']:.3f} (layers < "
            f"{half}) vs {metrics['demo_to_label_nosink_deep']:.3f}; labels → last "
            f"{metrics['label_to_last_nosink_shallow']:.3f} vs "
            f"{metrics['label_to_last_nosink_deep']:.3f}; other "
            f"{metrics['other_nosink_shallow']:.3f} vs {metrics['other_nosink_deep']:.3f}; share "
            "of the demonstration → label mass on token 0 "
            f"{metrics['sink_demo_to_label_nosink_shallow']:.2f} vs "
            f"{metrics['sink_demo_to_label_nosink_deep']:.2f}; of the last row "
            f"{metrics['sink_last_nosink_shallow']:.2f} vs "
            f"{metrics['sink_last_nosink_deep']:.2f}. Saliency (Wang et al.): demonstrations → "
            f"labels {metrics['saliency_demo_to_label_shallow']:.3g} vs "
            f"{metrics['saliency_demo_to_label_deep']:.3g}; labels → last "
            f"{metrics['saliency_label_to_last_shallow']:.3g} vs "
            f"{metrics['saliency_label_to_last_deep']:.3g}.\n",
            table(rows),
            "",
            comparison([("where each flow is strong", PAPER, f"{measured}; {shares}")]),
        ]
    )
    return ctx.result(metrics, {"flow": rows}, figures, report, evidence)
