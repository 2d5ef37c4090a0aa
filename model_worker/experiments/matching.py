"""Experiment `matching`: a direct test of the two-tower metric.

For each evaluation prompt `d_1 : l_1 … d_k : l_k x :` and each demonstration i, the prompt
with d_i copied into the query slot, `d_1 : l_1 … d_k : l_k d_i :`. If the query and key
matrices of the in-context heads measure similarity between the input and each demonstration,
these heads' attention over the label positions should peak on label i. Per head, over all
(prompt, i): how often the argmax over label positions is label i (chance 1/k), how often it is
a label position carrying the word l_i (chance: the share of demonstrations labelled l_i), the
mean attention on label i vs the mean on each other label; and whether the model then predicts
l_i (two-label argmax). Heads: the located in-context heads and, for each, a random head of
its layer that is not located, distinct within the draw (model_worker/experiments/controls.py:
two located heads of one layer get two different random heads).

Hypotheses (bootstrap over the base prompts; a prompt's cases stay together): the located
heads' argmax lands on the copied demonstration's label more often than chance, and more often
than for the random heads. The base prompts themselves are also run, for the adequacy gate.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch
from torch import Tensor

from model_worker.contracts.common import head_name
from model_worker.contracts.experiments import ExperimentResult
from model_worker.datasets import IclPrompt, format_prompt
from model_worker.experiments import stats
from model_worker.experiments.batching import Batch, Extra, PromptRun, run_prompts
from model_worker.experiments.context import Context, Row
from model_worker.experiments.controls import same_layer_draws
from model_worker.experiments.evidence import Evidence, adequacy
from model_worker.experiments.figure_data import bar_chart
from model_worker.experiments.locate import locate_for, location_note
from model_worker.experiments.progress import Stages
from model_worker.experiments.report import comparison, header, pct, table
from model_worker.model.capture import RunCache
from model_worker.model.interventions import Head

PAPER = (
    "hypothesis: the query/key matrices compute a similarity between the input and each "
    "demonstration, so attention should peak on the label of the matching demonstration"
)


def matched(prompt: IclPrompt) -> list[IclPrompt]:
    """The prompt once per demonstration i, with d_i as the query and l_i its true label."""
    out = []
    for text, label in prompt.demonstrations:
        other = prompt.false_label if label == prompt.true_label else prompt.true_label
        out.append(
            IclPrompt(
                text=format_prompt(prompt.demonstrations, text),
                input=text,
                true_label=label,
                false_label=other,
                demonstrations=prompt.demonstrations,
                variant=prompt.variant,
            )
        )
    return out


def label_attention(heads: Sequence[Head]) -> Extra:
    """Per row: attention of the last token on each label position, [K, P], for `heads`."""

    def extra(batch: Batch, cache: RunCache) -> list[Tensor]:
        return [
            torch.stack(
                [
                    cache.pattern[la, row, h, item.last, list(item.label_positions)]
                    for la, h in heads
                ]
            ).cpu()
            for row, item in enumerate(batch.items)
        ]

    return extra


def _head_row(
    head: Head, kind: str, runs: Sequence[tuple[PromptRun, int]], k: int
) -> dict[str, float | int | str | None]:
    hits, label_hits, chance_label, own, others = [], [], [], [], []
    for run, i in runs:
        attention = run.extra[k]  # [P]
        words = [w for _, w in run.item.prompt.demonstrations]
        best = int(attention.argmax())
        hits.append(best == i)
        label_hits.append(words[best] == words[i])
        chance_label.append(words.count(words[i]) / len(words))
        own.append(float(attention[i]))
        others.append(float(attention.sum() - attention[i]) / max(1, len(words) - 1))
    n_demos = len(runs[0][0].item.prompt.demonstrations) if runs else 1
    return {
        "head": head_name(*head),
        "kind": kind,
        "argmax_is_own_label": statistics.fmean(hits) if hits else 0.0,
        "chance": 1 / n_demos,
        "argmax_has_own_word": statistics.fmean(label_hits) if label_hits else 0.0,
        "word_chance": statistics.fmean(chance_label) if chance_label else 0.0,
        "attn_own_label": statistics.fmean(own) if own else 0.0,
        "attn_other_label_mean": statistics.fmean(others) if others else 0.0,
    }


def _mean(rows: Sequence[Row], key: str) -> float:
    return statistics.fmean(float(r[key] or 0) for r in rows) if rows else 0.0


def run(ctx: Context) -> ExperimentResult:
    stages = Stages(ctx.progress, {"locate": 2.0, "match": 2.0})
    location = locate_for(ctx, stages.stage("locate"))
    g = ctx.loaded.geometry
    randoms = same_layer_draws(location.heads, g.n_heads, ctx.seed, draws=1)[0]
    heads = location.heads + randoms
    base = ctx.prompts()
    base_runs = run_prompts(ctx.loaded, ctx.prepare(base), batch_size=ctx.batch_size)
    variants = [(p, i) for prompt in base for i, p in enumerate(matched(prompt))]
    origin = [b for b, prompt in enumerate(base) for _ in matched(prompt)]
    items = ctx.prepare([p for p, _ in variants])
    runs = run_prompts(
        ctx.loaded,
        items,
        batch_size=ctx.batch_size,
        extra=label_attention(heads),
        progress=stages.stage("match"),
        label="matching prompts",
    )
    kept = [
        (r, i, b)
        for r, (_, i), b in zip(runs, variants, origin, strict=True)
        if len(r.item.label_positions) == len(r.item.prompt.demonstrations)
    ]
    paired = [(r, i) for r, i, _ in kept]
    rows: list[Row] = [
        _head_row(head, "located" if k < len(location.heads) else "random, same layer", paired, k)
        for k, head in enumerate(heads)
    ]
    by_slot: list[Row] = []
    n_demos = len(base[0].demonstrations) if base else 0
    for slot in range(n_demos):
        at = [(r, i) for r, i in paired if i == slot]
        located = [_head_row(h, "located", at, k) for k, h in enumerate(location.heads)]
        by_slot.append(
            {
                "demonstration": slot + 1,
                "n": len(at),
                "located_argmax_is_own_label": _mean(located, "argmax_is_own_label"),
                "predicts_own_label": statistics.fmean(r.correct for r, _ in at) if at else 0.0,
            }
        )
    located_rows = [r for r in rows if r["kind"] == "located"]
    random_rows = [r for r in rows if r["kind"] != "located"]
    metrics = {
        "located_argmax_is_own_label": _mean(located_rows, "argmax_is_own_label"),
        "random_argmax_is_own_label": _mean(random_rows, "argmax_is_own_label"),
        "chance": 1 / n_demos if n_demos else 0.0,
        "located_argmax_has_own_word": _mean(located_rows, "argmax_has_own_word"),
        "random_argmax_has_own_word": _mean(random_rows, "argmax_has_own_word"),
        "word_chance": _mean(rows, "word_chance"),
        "located_attn_own_label": _mean(located_rows, "attn_own_label"),
        "located_attn_other_label": _mean(located_rows, "attn_other_label_mean"),
        "random_attn_own_label": _mean(random_rows, "attn_own_label"),
        "random_attn_other_label": _mean(random_rows, "attn_other_label_mean"),
        "predicts_own_label": statistics.fmean(r.correct for r, _ in paired) if paired else 0.0,
        "n_cases": float(len(paired)),
    }
    evidence = Evidence(adequacy=adequacy(base_runs, ctx.request.design))
    n_located = len(location.heads)

    def hit_rates(ks: range) -> list[float]:
        """Per base prompt: the share of (case, head in ks) whose argmax is the own label."""
        hits: dict[int, list[float]] = {}
        for r, i, b in kept:
            hits.setdefault(b, []).extend(float(int(r.extra[k].argmax()) == i) for k in ks)
        return [statistics.fmean(v) for _, v in sorted(hits.items())]

    located_hits = hit_rates(range(n_located))
    random_hits = hit_rates(range(n_located, len(heads)))
    evidence.add("located_argmax_is_own_label", stats.bootstrap_mean(located_hits))
    evidence.add("random_argmax_is_own_label", stats.bootstrap_mean(random_hits))
    evidence.decide(
        "the located heads' attention peaks on the copied demonstration's label more often "
        "than chance",
        "located_own_label_minus_chance",
        stats.bootstrap_mean(located_hits).shifted(metrics["chance"]),
        min_effect=0.05,
    )
    if random_hits:
        evidence.decide(
            "… and more often than random heads of the same layers",
            "located_minus_random_own_label",
            stats.bootstrap_diff(located_hits, random_hits, paired=True),
            min_effect=0.05,
        )
    evidence.add(
        "predicts_own_label",
        stats.bootstrap_mean(
            [
                statistics.fmean(float(r.correct) for r, _, b2 in kept if b2 == b)
                for b in sorted({b for _, _, b in kept})
            ]
        ),
    )
    figure = bar_chart(
        f"Matching test: attention argmax on the copied demonstration's label — {ctx.dataset.name}",
        [f"{r['head']} ({'rand' if r['kind'] != 'located' else 'loc'})" for r in rows],
        {
            "argmax = own label": [float(r["argmax_is_own_label"] or 0) for r in rows],
            "chance": [float(r["chance"] or 0) for r in rows],
            "attention on own label": [float(r["attn_own_label"] or 0) for r in rows],
            "attention on another label (mean)": [
                float(r["attn_other_label_mean"] or 0) for r in rows
            ],
        },
        ylabel="rate / attention",
    )
    measured = (
        f"located heads: argmax on label i in {pct(metrics['located_argmax_is_own_label'])} "
        f"of cases (chance {pct(metrics['chance'])}; random same-layer heads "
        f"{pct(metrics['random_argmax_is_own_label'])}); attention on label i "
        f"{metrics['located_attn_own_label']:.3f} vs {metrics['located_attn_other_label']:.3f} "
        f"on another label; the model predicts l_i in {pct(metrics['predicts_own_label'])}"
    )
    report = "\n".join(
        [
            header(ctx, "Matching — a demonstration's input as the query"),
            location_note(location),
            f"{len(base)} prompts × {n_demos} demonstrations = {len(paired)} cases.\n",
            f"Summary: {measured}.\n",
            table(rows),
            "\n### By demonstration slot (located heads)\n",
            table(by_slot),
            "",
            comparison(
                [("attention peaks on the matching demonstration's label", PAPER, measured)]
            ),
        ]
    )
    return ctx.result(
        metrics,
        {"matching": rows, "by_slot": by_slot, "location": location.candidates},
        {"matching": figure},
        report,
        evidence,
    )
