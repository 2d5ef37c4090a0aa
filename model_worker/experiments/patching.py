"""Experiment `patching`: activation patching over the dataset, denoising (clean activations
into the labels-swapped run), with 95% bootstrap intervals over prompts.

Per prompt: the clean prompt and its labels-swapped corruption (`model_worker.patching`), the
target its true label; attribution patching for every head (one forward and one backward
pass), the direct effect I(head | resid_pre) of every head on the clean prompt; then exact
patching, batched, of the top heads by mean attribution and of the in-context heads (the top
by mean direct effect): their outputs, their query at the last position, their keys and
values at the label positions. An effect over the prompts is the ratio of sums
Σ(LD_patched − LD_corrupted) / Σ(LD_clean − LD_corrupted) (the normalised metric, robust to
prompts whose corruption barely moves LD), its interval a percentile bootstrap over prompts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from numpy.typing import NDArray

from model_worker.analysis.patching import pearson
from model_worker.common.errors import PromptError, UserInputError
from model_worker.contracts.common import head_name
from model_worker.contracts.experiments import ExperimentResult
from model_worker.contracts.patching import PatchRequest
from model_worker.experiments import stats
from model_worker.experiments.batching import each_item, text_digest
from model_worker.experiments.context import Context, Row
from model_worker.experiments.evidence import Evidence, adequacy_of
from model_worker.experiments.figure_data import bar_chart, heatmap
from model_worker.experiments.progress import Stages
from model_worker.experiments.report import comparison, header, table
from model_worker.experiments.slices import Record
from model_worker.patching.engine import Patch, attribution, run_patched
from model_worker.patching.hooks import Site
from model_worker.patching.run import Pair, direct_effects, make_pair

#: Heads patched exactly (the top by mean attribution), and in-context heads whose q/k/v are.
TOP_EXACT = 10
IN_CONTEXT = 3
PARTS: tuple[Site, ...] = ("q", "k", "v")
PAPER = (
    "Yu & Ananiadou: the in-context heads' keys at the label positions and the query at the "
    "last position decide where attention goes (two towers); zeroing them breaks ICL"
)


def ratio(columns: NDArray[np.float64]) -> NDArray[np.float64]:
    """Σ delta / Σ span over the last axis of [..., 2, n] (row 0 delta, row 1 span)."""
    return columns[..., 0, :].sum(-1) / columns[..., 1, :].sum(-1)


def effect(deltas: Sequence[float] | NDArray[np.float64], spans: Sequence[float]) -> stats.Interval:
    """The ratio-of-sums effect and its bootstrap interval over prompts."""
    return stats.bootstrap_stat([list(deltas), list(spans)], ratio)


def run(ctx: Context) -> ExperimentResult:
    loaded, g = ctx.loaded, ctx.loaded.geometry
    stages = Stages(ctx.progress, {"attribution": 1.0, "exact": 1.0})
    items = ctx.prompts()

    def pair_of(index: int) -> Pair | None:
        """The prompt's clean/corrupted pair (None: its corruption cannot be patched)."""
        item = items[index]
        request = PatchRequest(
            prompt=item.text,
            target=item.true_label,
            labels=[item.true_label, item.false_label],
            directions=["denoising"],
        )
        try:
            return make_pair(loaded, request, ctx.max_tokens)
        except PromptError:
            raise  # over the prompt limit: one clear line, as every experiment says it
        except UserInputError:
            return None  # a corruption that changes the length, or leaves LD unchanged

    def attributed_of(index: int) -> Record:
        pair = pair_of(index)
        if pair is None:
            return {"patched": False}
        found = attribution(
            loaded, pair.corrupted.ids, pair.clean_run, pair.target_id, pair.other_id
        )
        return {
            "patched": True,
            "span": pair.ld(pair.clean_run.logits) - pair.ld(pair.corrupted_run.logits),
            "clean_right": pair.ld(pair.clean_run.logits) > 0,
            "estimate": found.z.sum(1).flatten().double().cpu(),  # [L·H] LD change per head
            "direct": direct_effects(loaded, pair).flatten().double().cpu(),
        }

    # every per-prompt pass goes in slices (batching.each_item), as the batched ones do
    texts = [item.text for item in items]
    first = each_item(
        len(items),
        attributed_of,
        digest=text_digest(texts, "patching: attribution"),
        label="attribution",
        progress=stages.stage("attribution"),
    )
    kept = [i for i, record in enumerate(first) if record["patched"]]
    if not kept:
        raise UserInputError("no prompt of the dataset could be patched (see the corruption)")
    spans = [float(first[i]["span"]) for i in kept]
    span_arr = np.asarray(spans)
    est = torch.stack([first[i]["estimate"] for i in kept]).numpy()  # [n, L·H]
    direct = torch.stack([first[i]["direct"] for i in kept]).numpy()
    attributed = est.sum(0) / span_arr.sum()
    direct_mean = direct.mean(0)
    top = [int(i) for i in np.argsort(-np.abs(attributed))[:TOP_EXACT]]
    in_context = [int(i) for i in np.argsort(-direct_mean)[:IN_CONTEXT]]
    patched = list(dict.fromkeys(top + in_context))

    def exact_of(index: int) -> Record:
        pair = pair_of(kept[index])
        assert pair is not None  # patched in the first pass: the same prompt, the same pair
        last, labels = pair.last, tuple(pair.label_positions)
        rows: list[list[Patch]] = [[]] + [
            [Patch("z", h // g.n_heads, h % g.n_heads)] for h in patched
        ]
        rows += [
            [Patch(part, h // g.n_heads, h % g.n_heads, (last,) if part == "q" else labels)]
            for h in in_context
            for part in PARTS
        ]
        logits = run_patched(loaded, pair.corrupted.ids, pair.clean_run, rows).logits
        lds = [pair.ld(row) for row in logits]
        return {"deltas": [ld - lds[0] for ld in lds[1:]]}

    second = each_item(
        len(kept),
        exact_of,
        digest=text_digest([texts[i] for i in kept], f"patching: exact {patched} {in_context}"),
        label="exact",
        progress=stages.stage("exact"),
    )
    exact_rows = [record["deltas"][: len(patched)] for record in second]
    qkv_rows = [record["deltas"][len(patched) :] for record in second]
    exact = np.asarray(exact_rows)
    qkv = np.asarray(qkv_rows)
    evidence = Evidence(
        adequacy=adequacy_of([bool(first[i]["clean_right"]) for i in kept], ctx.request.design)
    )
    head_rows: list[Row] = []
    exact_intervals = {h: effect(exact[:, j], spans) for j, h in enumerate(patched)}
    for flat in range(g.n_layers * g.n_heads):
        layer, head = divmod(flat, g.n_heads)
        interval = effect(est[:, flat], spans)
        measured = exact_intervals.get(flat)
        head_rows.append(
            {
                "name": head_name(layer, head),
                "layer": layer,
                "head": head,
                "attribution": interval.estimate,
                "attribution_low": interval.low,
                "attribution_high": interval.high,
                "exact": None if measured is None else measured.estimate,
                "exact_low": None if measured is None else measured.low,
                "exact_high": None if measured is None else measured.high,
                "direct": float(direct_mean[flat]),
            }
        )
    qkv_table: list[Row] = []
    for j, flat in enumerate(in_context):
        name = head_name(*divmod(flat, g.n_heads))
        for k, part in enumerate(PARTS):
            interval = effect(qkv[:, 3 * j + k], spans)
            qkv_table.append(
                {
                    "name": name,
                    "part": part,
                    "where": "last position" if part == "q" else "label positions",
                    "effect": interval.estimate,
                    "low": interval.low,
                    "high": interval.high,
                }
            )
    lead = head_name(*divmod(in_context[0], g.n_heads))
    evidence.decide(
        f"patching the top in-context head {lead}'s output restores the clean label",
        f"{lead} output effect",
        exact_intervals[in_context[0]],
    )
    for row in qkv_table[:3]:
        evidence.decide(
            f"patching {lead}'s {row['part']} ({row['where']}) moves the output towards clean",
            f"{lead} {row['part']} effect",
            effect(qkv[:, PARTS.index(str(row["part"]))], spans),
        )
    agreement = pearson(
        [float(attributed[h]) for h in patched], [exact_intervals[h].estimate for h in patched]
    )
    metrics = {
        "n_used": float(len(kept)),
        "n_skipped": float(len(items) - len(kept)),
        "agreement_r": float("nan") if agreement is None else agreement,
        "top_attribution": float(attributed[top[0]]),
        "in_context_exact": exact_intervals[in_context[0]].estimate,
    }
    matrix = attributed.reshape(g.n_layers, g.n_heads)
    names = [head_name(*divmod(h, g.n_heads)) for h in patched]

    def by_part(column: str) -> dict[str, list[float]]:
        return {p: [float(r[column] or 0) for r in qkv_table if r["part"] == p] for p in PARTS}

    figures = {
        "patching_heatmap": heatmap(
            f"Denoising effect per head (attribution patching) — {ctx.dataset.name}",
            matrix.tolist(),
        ),
        "direct_heatmap": heatmap(
            f"Direct effect I(head | resid_pre) on the clean prompts — {ctx.dataset.name}",
            direct_mean.reshape(g.n_layers, g.n_heads).tolist(),
        ),
        "patching_top": bar_chart(
            "Exact vs attribution patching, top heads (95% intervals)",
            names,
            {
                "exact": [exact_intervals[h].estimate for h in patched],
                "attribution": [float(attributed[h]) for h in patched],
            },
            ylabel="normalised effect",
            low={"exact": [exact_intervals[h].low for h in patched]},
            high={"exact": [exact_intervals[h].high for h in patched]},
        ),
        "patching_qkv": bar_chart(
            "In-context heads: query (last position), keys and values (labels) patched",
            [head_name(*divmod(h, g.n_heads)) for h in in_context],
            by_part("effect"),
            ylabel="normalised effect",
            low=by_part("low"),
            high=by_part("high"),
        ),
    }
    summary = (
        f"{len(kept)} prompts patched ({len(items) - len(kept)} skipped); top head by attribution "
        f"{names[0]} ({attributed[top[0]]:+.3f}); in-context head {lead}: output "
        f"{exact_intervals[in_context[0]].text()}, q/k/v "
        + ", ".join(f"{r['part']} {float(r['effect'] or 0):+.3f}" for r in qkv_table[:3])
    )
    report = "\n".join(
        [
            header(ctx, "Patching — denoising the labels-swapped prompts"),
            "Effect = Σ(LD_patched − LD_corrupted) / Σ(LD_clean − LD_corrupted) over the "
            "prompts, LD = logit[true label] − logit[false label]; 95% percentile bootstrap "
            "over prompts. Attribution patching: one forward and one backward pass per prompt "
            f"(agreement with exact patching over the {len(patched)} exact heads: r = "
            f"{metrics['agreement_r']:.3f}).\n",
            f"Summary: {summary}.\n",
            table([r for r in head_rows if r["exact"] is not None]),
            "",
            table(qkv_table),
            "",
            comparison([("what decides the answer", PAPER, summary)]),
        ]
    )
    tables = {"patching_heads": head_rows, "patching_qkv": qkv_table}
    return ctx.result(metrics, tables, figures, report, evidence)
