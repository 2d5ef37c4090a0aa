"""Experiment `layers`: attention vs FFN log-probability increase per layer over the dataset
(paper Fig. 2, there on one prompt).

Per prompt, at the last token, for the true label token: I(attn_l | resid_pre_l) and
I(ffn_l | resid_mid_l) (fixed norm mode, as `analyze()`), averaged over the correctly answered
prompts (all of them with none correct). The paper's claim: the attention layers of the deep
half carry the label information; the report says whether the FFN layers dominate instead.
Hypothesis: the deep attention layers add more than the deep FFN layers; quantity: per prompt,
the deep half's summed attention increases minus its summed FFN increases (bootstrap interval
over prompts). Every layer's mean carries its bootstrap interval.
"""

from __future__ import annotations

import torch
from torch import Tensor

from model_worker.analysis.heads import layer_increase_table
from model_worker.contracts.experiments import ExperimentResult
from model_worker.experiments import stats
from model_worker.experiments.batching import Batch, Extra, accuracy
from model_worker.experiments.context import Context, Row
from model_worker.experiments.evidence import Evidence, adequacy, interval_columns
from model_worker.experiments.figure_data import line_chart
from model_worker.experiments.report import comparison, header, pct, table
from model_worker.model.capture import RunCache
from model_worker.model.loading import LoadedModel
from model_worker.run.state import final_projector

PAPER = 'GPT2-large, one prompt: "almost all the improvements are caused by deep attention layers"'


def layer_table(loaded: LoadedModel) -> Extra:
    """Per row: [2, L] attention and FFN increases of the true label at the last token."""

    def extra(batch: Batch, cache: RunCache) -> list[Tensor]:
        out = []
        for row, item in enumerate(batch.items):
            projector = final_projector(loaded, cache.resid_final[row, item.last], "fixed")
            attn, ffn = layer_increase_table(
                projector=projector,
                resid_pre=cache.resid_pre[:, row, item.last],
                attn_out=cache.attn_out[:, row, item.last],
                mlp_out=cache.mlp_out[:, row, item.last],
                target=item.true_id,
            )
            out.append(torch.stack([attn, ffn]).cpu())
        return out

    return extra


def run(ctx: Context) -> ExperimentResult:
    runs = ctx.run_dataset(layer_table(ctx.loaded), ctx.progress, "layer increases")
    used = [r for r in runs if r.correct] or runs
    tables = torch.stack([r.extra for r in used])  # [N, 2, L]
    mean, sd = tables.mean(0), tables.std(0) if len(used) > 1 else torch.zeros_like(tables[0])
    n_layers = ctx.loaded.geometry.n_layers
    rows: list[Row] = [
        {
            "layer": layer,
            "attn_increase": float(mean[0, layer]),
            "attn_sd": float(sd[0, layer]),
            "ffn_increase": float(mean[1, layer]),
            "ffn_sd": float(sd[1, layer]),
        }
        for layer in range(n_layers)
    ]
    bounds = stats.bootstrap_means(tables.reshape(len(used), -1).double().numpy())
    for layer in range(n_layers):
        rows[layer].update(interval_columns("attn_increase", bounds[layer]))
        rows[layer].update(interval_columns("ffn_increase", bounds[n_layers + layer]))
    deep = range(n_layers // 2, n_layers)
    attn_deep = sum(float(mean[0, la]) for la in deep)
    ffn_deep = sum(float(mean[1, la]) for la in deep)
    top_attn = int(mean[0].argmax())
    top_ffn = int(mean[1].argmax())
    metrics = {
        "accuracy": accuracy(runs),
        "n_used": float(len(used)),
        "attn_total": float(mean[0].sum()),
        "ffn_total": float(mean[1].sum()),
        "attn_deep_total": attn_deep,
        "ffn_deep_total": ffn_deep,
        "top_attn_layer": float(top_attn),
        "top_ffn_layer": float(top_ffn),
        "attn_share_positive": sum(float(v) > 0 for v in mean[0][n_layers // 2 :]) / len(deep),
    }
    evidence = Evidence(adequacy=adequacy(runs, ctx.request.design))
    per_prompt_attn = tables[:, 0, n_layers // 2 :].sum(-1)
    per_prompt_ffn = tables[:, 1, n_layers // 2 :].sum(-1)
    evidence.add("attn_deep_total", stats.bootstrap_mean(per_prompt_attn.tolist()))
    evidence.add("ffn_deep_total", stats.bootstrap_mean(per_prompt_ffn.tolist()))
    evidence.decide(
        "the deep attention layers add more to the true label's log-probability than the deep "
        "FFN layers",
        "deep_attention_minus_deep_ffn",
        stats.bootstrap_mean((per_prompt_attn - per_prompt_ffn).tolist()),
        min_effect=0.1,
    )
    figure = line_chart(
        f"Mean attention vs FFN log-prob increase per layer — {ctx.dataset.name}",
        list(range(n_layers)),
        {"attention": [float(v) for v in mean[0]], "FFN": [float(v) for v in mean[1]]},
        xlabel="layer",
        ylabel="log-prob increase (true label)",
        low={
            "attention": [float(r["attn_increase_low"] or 0) for r in rows],
            "FFN": [float(r["ffn_increase_low"] or 0) for r in rows],
        },
        high={
            "attention": [float(r["attn_increase_high"] or 0) for r in rows],
            "FFN": [float(r["ffn_increase_high"] or 0) for r in rows],
        },
    )
    dominant = "attention" if attn_deep >= ffn_deep else "FFN"
    verdict = (
        f"deep half (layers ≥ {n_layers // 2}): attention {attn_deep:+.2f} vs FFN "
        f"{ffn_deep:+.2f} in total — {dominant} layers dominate; largest attention layer "
        f"{top_attn} ({float(mean[0, top_attn]):+.2f}), largest FFN layer {top_ffn} "
        f"({float(mean[1, top_ffn]):+.2f})"
    )
    report = "\n".join(
        [
            header(ctx, "Layers — attention vs FFN increase per layer (paper Fig. 2)"),
            f"Mean over the {len(used)} correctly answered prompts of {len(runs)} (accuracy "
            f"{pct(metrics['accuracy'])}); I(attn_l | resid_pre_l) and I(ffn_l | resid_mid_l) "
            "for the true label at the last token, fixed norm mode.\n",
            f"Summary: {verdict}.\n",
            table(rows),
            "",
            comparison([("which layers carry the label", PAPER, verdict)]),
        ]
    )
    return ctx.result(metrics, {"layers": rows}, {"layers": figure}, report, evidence)
