"""Experiment 5: imbalanced (last true demonstration removed) and reordered (true
demonstrations first, false ones nearest the input) variants vs the balanced prompts
(paper Fig. 8–11).

Both prompt sets come from the same seed, so prompt i of the variant has the same input and
demonstrations as prompt i of the balanced set. Per head: attention of the last token summed
over true and over false label positions, averaged over prompts. Heads shown: the 20 with the
largest mean increase on the location prompts (Fig. 10/11) and the located in-context heads
(Fig. 8/9).

With the counterbalanced design (default) "imbalanced" drops the true demonstration nearest the
input and "reordered" swaps the true and false slots of each arrangement (FFTT → TTFF,
FTFT → TFTF, …). Hypotheses, each with a paired bootstrap interval over prompts: accuracy
falls; the located heads' mean attention on true labels falls; on false labels it rises (per
prompt, balanced minus variant, or variant minus balanced). Note that an imbalanced prompt has
one true label fewer, so its summed true-label attention falls partly by construction.
Per demonstration arrangement of the balanced prompt, the same differences are tabled.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from model_worker.contracts import ExperimentResult, head_name
from model_worker.datasets import Variant
from model_worker.experiments import paper, stats
from model_worker.experiments.batching import PromptRun, accuracy, run_prompts
from model_worker.experiments.context import Context, Row
from model_worker.experiments.evidence import (
    Evidence,
    accuracy_interval,
    adequacy,
    interval_columns,
)
from model_worker.experiments.figure_data import bar_chart
from model_worker.experiments.locate import locate_for, location_note
from model_worker.experiments.progress import Stages
from model_worker.experiments.report import comparison, header, pct, table
from model_worker.interventions import Head

TOP = 20


def _mean(runs: Sequence[PromptRun], head: Head, true: bool) -> float:
    return statistics.fmean(float((r.attn_true if true else r.attn_false)[head]) for r in runs)


def run(ctx: Context) -> ExperimentResult:
    variant: Variant = "imbalanced" if ctx.request.name == "imbalance" else "reordered"
    stages = Stages(ctx.progress, {"locate": 2.0, "balanced": 1.0, variant: 1.0})
    location = locate_for(ctx, stages.stage("locate"))
    sets: dict[str, list[PromptRun]] = {}
    names: tuple[Variant, Variant] = ("balanced", variant)
    for name in names:
        items = ctx.prepare(ctx.prompts(name))
        sets[name] = run_prompts(
            ctx.loaded,
            items,
            batch_size=ctx.batch_size,
            progress=stages.stage(name),
            label=f"{name} prompts",
        )
    balanced, changed = sets["balanced"], sets[variant]
    shown = list(dict.fromkeys(location.top(TOP) + location.heads))
    rows: list[Row] = [
        {
            "head": head_name(*head),
            "increase_rank": location.top(len(location.mean_increase.flatten())).index(head) + 1,
            "located": "yes" if head in location.heads else "no",
            "attn_true_balanced": _mean(balanced, head, True),
            f"attn_true_{variant}": _mean(changed, head, True),
            "attn_false_balanced": _mean(balanced, head, False),
            f"attn_false_{variant}": _mean(changed, head, False),
        }
        for head in shown
    ]
    top_rows = [r for r in rows if int(r["increase_rank"] or 0) <= TOP]
    located_rows = [r for r in rows if r["located"] == "yes"]

    def avg(rs: Sequence[Row], key: str) -> float:
        return statistics.fmean(float(r[key] or 0) for r in rs) if rs else 0.0

    true_drops = sum(
        float(r[f"attn_true_{variant}"] or 0) < float(r["attn_true_balanced"] or 0)
        for r in top_rows
    )
    false_rises = sum(
        float(r[f"attn_false_{variant}"] or 0) > float(r["attn_false_balanced"] or 0)
        for r in top_rows
    )
    metrics = {
        "accuracy_balanced": accuracy(balanced),
        f"accuracy_{variant}": accuracy(changed),
        "located_attn_true_balanced": avg(located_rows, "attn_true_balanced"),
        f"located_attn_true_{variant}": avg(located_rows, f"attn_true_{variant}"),
        "located_attn_false_balanced": avg(located_rows, "attn_false_balanced"),
        f"located_attn_false_{variant}": avg(located_rows, f"attn_false_{variant}"),
        "top20_true_attention_drops": true_drops / max(1, len(top_rows)),
        "top20_false_attention_rises": false_rises / max(1, len(top_rows)),
    }
    evidence = Evidence(adequacy=adequacy(balanced, ctx.request.design))
    evidence.add("accuracy_balanced", accuracy_interval(balanced))
    evidence.add(f"accuracy_{variant}", accuracy_interval(changed))
    heads = location.heads

    def located(r: PromptRun, true: bool) -> float:
        table = r.attn_true if true else r.attn_false
        return statistics.fmean(float(table[h]) for h in heads)

    checks = (
        ("accuracy falls", "accuracy_drop", lambda b, c: float(b.correct) - float(c.correct)),
        (
            "the located heads' attention on true labels falls",
            "located_attn_true_drop",
            lambda b, c: located(b, True) - located(c, True),
        ),
        (
            "the located heads' attention on false labels rises",
            "located_attn_false_rise",
            lambda b, c: located(c, False) - located(b, False),
        ),
    )
    arrangement_rows: dict[str, Row] = {}
    for hypothesis, quantity, change in checks:
        values = [change(b, c) for b, c in zip(balanced, changed, strict=True)]
        evidence.decide(
            f"{variant}: {hypothesis}",
            quantity,
            stats.bootstrap_mean(values),
            min_effect=0.05 if quantity == "accuracy_drop" else 0.02,
        )
        groups: dict[str, list[float]] = {}
        for b, v in zip(balanced, values, strict=True):
            groups.setdefault(b.item.prompt.arrangement, []).append(v)
        for arrangement, members in sorted(groups.items()):
            row = arrangement_rows.setdefault(
                arrangement, {"arrangement": arrangement, "n": len(members)}
            )
            row.update(interval_columns(quantity, stats.bootstrap_mean(members)))
    arrangements = list(arrangement_rows.values())
    figures = {
        f"{variant}_located": bar_chart(
            f"Attention on true/false labels, balanced vs {variant} — in-context heads",
            [str(r["head"]) for r in located_rows],
            {
                "true, balanced": [float(r["attn_true_balanced"] or 0) for r in located_rows],
                f"true, {variant}": [float(r[f"attn_true_{variant}"] or 0) for r in located_rows],
                "false, balanced": [float(r["attn_false_balanced"] or 0) for r in located_rows],
                f"false, {variant}": [float(r[f"attn_false_{variant}"] or 0) for r in located_rows],
            },
            ylabel="attention (sum)",
        ),
        f"{variant}_top20": bar_chart(
            f"True-label attention, balanced vs {variant} — top {TOP} heads by increase",
            [str(r["head"]) for r in top_rows],
            {
                "balanced": [float(r["attn_true_balanced"] or 0) for r in top_rows],
                variant: [float(r[f"attn_true_{variant}"] or 0) for r in top_rows],
            },
            ylabel="attention on true labels",
        ),
    }
    expected = paper.IMBALANCE if variant == "imbalanced" else paper.REORDER
    title = (
        "imbalanced labels (Fig. 8, 10)" if variant == "imbalanced" else "re-ordered (Fig. 9, 11)"
    )
    report = "\n".join(
        [
            header(ctx, f"Experiment 5 — {title}"),
            location_note(location),
            f"Accuracy: balanced {pct(metrics['accuracy_balanced'])}, {variant} "
            f"{pct(metrics[f'accuracy_{variant}'])} ({len(balanced)} paired prompts).\n",
            table(rows),
            "\n### Per demonstration arrangement of the balanced prompt (paired changes)\n",
            table(arrangements),
            "",
            comparison(
                [
                    (
                        f"attention on true labels, balanced → {variant}",
                        expected,
                        f"in-context heads {metrics['located_attn_true_balanced']:.3f} → "
                        f"{metrics[f'located_attn_true_{variant}']:.3f}; drops in {true_drops} of "
                        f"the top {len(top_rows)} heads",
                    ),
                    (
                        f"attention on false labels, balanced → {variant}",
                        "rises (imbalanced)" if variant == "imbalanced" else "—",
                        f"in-context heads {metrics['located_attn_false_balanced']:.3f} → "
                        f"{metrics[f'located_attn_false_{variant}']:.3f}; rises in {false_rises} "
                        f"of the top {len(top_rows)} heads",
                    ),
                ]
            ),
        ]
    )
    return ctx.result(
        metrics,
        {"attention": rows, "by_arrangement": arrangements, "location": location.candidates},
        figures,
        report,
        evidence,
    )
