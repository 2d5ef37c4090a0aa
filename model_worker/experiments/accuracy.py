"""Experiment 1: ICL accuracy per input class and label assignment (paper Table 2).

For each of the first two classes c, `n` prompts with c labelled "foo" (half the inputs of
class c, true label foo; half of another class, true label bar). Accuracy: the true label's
token beats the other label's at the last position (argmax over the two label tokens); the
argmax over the whole vocabulary is reported beside it.

Every accuracy carries its exact binomial (Clopper–Pearson) 95% interval; the accuracy per
demonstration arrangement (FFTT, FTFT, …) is reported beside the overall one, and the
difference between prompts whose nearest demonstration is true and those whose nearest is
false measures how much the model answers from position.
"""

from __future__ import annotations

from model_worker.contracts.experiments import ExperimentResult
from model_worker.experiments import paper, stats
from model_worker.experiments.batching import PromptRun, accuracy, run_prompts
from model_worker.experiments.batching import vocab_accuracy as vocab_acc
from model_worker.experiments.context import Context, Row
from model_worker.experiments.data import class_of
from model_worker.experiments.evidence import (
    CHANCE,
    Evidence,
    accuracy_interval,
    adequacy,
    by_arrangement,
    interval_columns,
    position_effect,
)
from model_worker.experiments.figure_data import bar_chart
from model_worker.experiments.progress import Stages
from model_worker.experiments.report import comparison, header, pct, table


def run(ctx: Context) -> ExperimentResult:
    foo_classes = ctx.dataset.classes[:2]
    stages = Stages(ctx.progress, {c: 1.0 for c in foo_classes})
    classes = class_of(ctx.dataset)
    cells: dict[tuple[str, str, str], list[PromptRun]] = {}
    everything: list[PromptRun] = []
    for foo_class in foo_classes:
        items = ctx.prepare(ctx.prompts(foo_class=foo_class))
        runs = run_prompts(
            ctx.loaded,
            items,
            batch_size=ctx.batch_size,
            progress=stages.stage(foo_class),
            label=f"foo = {foo_class}",
        )
        everything += runs
        for r in runs:
            key = (foo_class, classes[r.item.prompt.input], r.item.prompt.true_label)
            cells.setdefault(key, []).append(r)
    rows: list[Row] = [
        {
            "foo_class": foo,
            "input_class": input_class,
            "true_label": label,
            "n": len(runs),
            **interval_columns("accuracy", accuracy_interval(runs)),
            "vocab_accuracy": vocab_acc(runs),
            "paper_gpt2_large": paper.TABLE2.get((input_class, label)),
        }
        for (foo, input_class, label), runs in sorted(cells.items())
    ]
    names = [f"{r['input_class']}→{r['true_label']}" for r in rows]
    series = {
        "two-label argmax": [float(r["accuracy"] or 0) for r in rows],
        "vocabulary argmax": [float(r["vocab_accuracy"] or 0) for r in rows],
    }
    if all(r["paper_gpt2_large"] is not None for r in rows):
        series["paper (GPT2-large)"] = [float(r["paper_gpt2_large"] or 0) for r in rows]
    figure = bar_chart(
        f"ICL accuracy on {ctx.dataset.name} ({ctx.loaded.name})",
        names,
        series,
        ylabel="accuracy",
        low={"two-label argmax": [float(r["accuracy_low"] or 0) for r in rows]},
        high={"two-label argmax": [float(r["accuracy_high"] or 0) for r in rows]},
    )
    evidence = Evidence(adequacy=adequacy(everything, ctx.request.design))
    evidence.add("accuracy", accuracy_interval(everything))
    evidence.add("vocab_accuracy", stats.rate([r.correct_vocab for r in everything]))
    evidence.decide(
        "the model does the task above chance (two labels)",
        "accuracy_minus_chance",
        accuracy_interval(everything).shifted(CHANCE),
        min_effect=0.05,
        behaviour=True,
    )
    arrangements = by_arrangement(evidence, everything)
    evidence.decide(
        "the model answers from position: more accurate when the nearest demonstration is true",
        "accuracy_true_nearest_minus_false_nearest",
        position_effect(everything),
        min_effect=0.05,
        behaviour=True,
    )
    metrics = {
        "accuracy": accuracy(everything),
        "vocab_accuracy": vocab_acc(everything),
        "min_cell_accuracy": min(float(r["accuracy"] or 0) for r in rows),
        "n_prompts": float(len(everything)),
    }
    compared = [
        (
            f"{r['input_class']} input, true label {r['true_label']}",
            pct(float(r["paper_gpt2_large"])) if r["paper_gpt2_large"] is not None else "—",
            pct(float(r["accuracy"] or 0)),
        )
        for r in rows
    ]
    report = "\n".join(
        [
            header(ctx, "Experiment 1 — ICL accuracy (paper Table 2)"),
            f"Design: {ctx.request.design}.\n",
            "Accuracy = the true label's token beats the other label's at the last token "
            '(argmax over " foo"/" bar"); `vocab_accuracy` = it is the argmax over the '
            "whole vocabulary.\n",
            f"Overall: **{pct(metrics['accuracy'])}** (two labels), "
            f"{pct(metrics['vocab_accuracy'])} (vocabulary) over {len(everything)} prompts.\n",
            table(rows),
            "\n### Per demonstration arrangement\n",
            table(arrangements),
            "",
            comparison(compared),
        ]
    )
    return ctx.result(
        metrics,
        {"accuracy": rows, "by_arrangement": arrangements},
        {"accuracy": figure},
        report,
        evidence,
    )
