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
prompt, balanced minus variant, or variant minus balanced).

Reordering maps the six arrangements onto each other in mirror pairs (FFTT↔TTFF, FTFT↔TFTF,
TFFT↔FTTF), so "balanced minus reordered" over counterbalanced prompts sums each pair's effect
in both directions: a position effect cancels by construction. The reorder hypotheses are
therefore sign-aligned: each pair is read in the paper's direction, from the arrangement whose
demonstration nearest the input is true to its mirror (`MIRROR_PAIRS`: FFTT → TTFF, the paper's
comparison, first), so a prompt whose balanced arrangement ends in F counts as variant minus
balanced. Verdicts: the paper's pair FFTT → TTFF alone (`…_fftt_ttff`), then all pairs pooled
(sign-aligned); the table `by_mirror_pair` gives every pair with its intervals.

An imbalanced prompt has one true label fewer, so its summed true-label attention falls partly
by construction. Two corrections are reported beside the raw drop (`located_attn_true_drop`):
- per label occurrence (`..._per_label`): the attention summed over the true labels divided by
  their number (2 balanced, 1 imbalanced), i.e. the mean attention on one true label;
- a matched control (`..._corrected`, the verdict the summary uses): the same prompts with the
  false demonstration nearest the input dropped instead (variant "minority-false"); the
  false-label attention they lose is what dropping one demonstration of a label removes
  mechanically. Corrected true drop = (balanced − imbalanced true-label attention) −
  (balanced − control false-label attention); corrected false rise = (imbalanced − balanced
  false-label attention) − (control − balanced true-label attention). Under counterbalancing
  the dropped true and the dropped false demonstration sit in the same positions equally often.

Rates over heads ("drops in 17 of the top 20 heads") carry a 95% interval from resampling the
prompts (stats.bootstrap_over_heads: every resample recomputes each head's mean change, then
the share of heads whose change is above 0); hypothesis: the change goes the stated way in more
than half of the top 20 heads.
Per demonstration arrangement of the balanced prompt, the same differences are tabled.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Literal

from model_worker.contracts.common import head_name
from model_worker.contracts.experiments import ExperimentResult
from model_worker.datasets import Variant
from model_worker.experiments import paper, stats
from model_worker.experiments.batching import PromptRun, accuracy, run_prompts
from model_worker.experiments.context import Context, Row
from model_worker.experiments.evidence import (
    Evidence,
    accuracy_interval,
    adequacy,
)
from model_worker.experiments.figure_data import bar_chart
from model_worker.experiments.locate import locate_for, location_note
from model_worker.experiments.progress import Stages
from model_worker.experiments.report import comparison, header, pct, table
from model_worker.model.interventions import Head

TOP = 20
#: the matched control of the imbalanced prompts: a false demonstration dropped instead
CONTROL: Variant = "minority-false"
#: a rate over the top heads is "most of them" above this share
MOST = 0.5


#: the reorder's mirror pairs, each read from the arrangement whose nearest demonstration is
#: true to its mirror (true demonstrations moved away from the input); the paper's first
MIRROR_PAIRS: tuple[tuple[str, str], ...] = (("FFTT", "TTFF"), ("FTFT", "TFTF"), ("TFFT", "FTTF"))
#: the paper's comparison (Fig. 9/11): every prompt FFTT, reordered TTFF
PAPER_PAIR = "FFTT→TTFF"


def pair_of(arrangement: str) -> tuple[str, float]:
    """The mirror pair `from→to` that an arrangement belongs to, and the sign that reads its
    balanced − reordered change in that pair's direction (+1 from the `from` side, −1 from the
    `to` side)."""
    for first, second in MIRROR_PAIRS:
        if arrangement in (first, second):
            return f"{first}→{second}", 1.0 if arrangement == first else -1.0
    # other demonstration counts: read from the side whose nearest demonstration is true
    mirror = arrangement.translate(str.maketrans("TF", "FT"))
    first, second = (arrangement, mirror) if arrangement.endswith("T") else (mirror, arrangement)
    return f"{first}→{second}", 1.0 if arrangement == first else -1.0


def sign_aligned(arrangements: Sequence[str], changes: Sequence[float]) -> list[float]:
    """Per prompt, its balanced − reordered change read in its mirror pair's direction
    (`pair_of`): over counterbalanced prompts the raw changes of a pair cancel by
    construction, the aligned ones add up."""
    return [
        change * pair_of(arrangement)[1]
        for arrangement, change in zip(arrangements, changes, strict=True)
    ]


def _mean(runs: Sequence[PromptRun], head: Head, true: bool) -> float:
    return statistics.fmean(float((r.attn_true if true else r.attn_false)[head]) for r in runs)


def run(ctx: Context) -> ExperimentResult:
    variant: Variant = "imbalanced" if ctx.request.name == "imbalance" else "reordered"
    names: tuple[Variant, ...] = ("balanced", variant)
    if variant == "imbalanced":
        names += (CONTROL,)
    stages = Stages(ctx.progress, {"locate": 2.0, **dict.fromkeys(names, 1.0)})
    location = locate_for(ctx, stages.stage("locate"))
    sets: dict[str, list[PromptRun]] = {}
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
    if CONTROL in sets:
        for row, head in zip(rows, shown, strict=True):
            row["attn_true_control"] = _mean(sets[CONTROL], head, True)
            row["attn_false_control"] = _mean(sets[CONTROL], head, False)
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
    control = sets.get(CONTROL)

    def located(kind: Kind, true: bool) -> list[float]:
        """Per prompt: the kind's change, averaged over the located heads."""
        rows = head_changes(balanced, changed, heads, true, kind=kind, control=control)
        return [statistics.fmean(row) for row in rows]

    accuracy_drops = [
        float(b.correct) - float(c.correct) for b, c in zip(balanced, changed, strict=True)
    ]
    checks: list[tuple[str, str, list[float]]] = [
        ("accuracy falls", "accuracy_drop", accuracy_drops),
        (
            "the located heads' attention on true labels falls (raw sum"
            + (": partly mechanical, one true label fewer)" if control is not None else ")"),
            "located_attn_true_drop",
            located("raw", True),
        ),
        (
            "the located heads' attention on false labels rises",
            "located_attn_false_rise",
            located("raw", False),
        ),
    ]
    if control is not None:
        checks += [
            (
                "the located heads' attention per true label falls (per label occurrence)",
                "located_attn_true_drop_per_label",
                located("per_label", True),
            ),
            (
                "the located heads' attention on the true label that stays falls "
                "(position-matched: the dropped demonstration's label left out of the balanced "
                "sum, so nothing falls by construction)",
                "located_attn_true_drop_kept",
                located("kept", True),
            ),
            (
                "dropping a true demonstration costs the located heads more true-label "
                "attention than dropping a false one (matched control) costs false-label "
                "attention",
                "located_attn_true_drop_vs_control",
                located("vs_control", True),
            ),
        ]
        metrics["accuracy_control"] = accuracy(control)
        evidence.add("accuracy_control", accuracy_interval(control))
    reordered = variant == "reordered"
    arrangements_of = [b.item.prompt.arrangement for b in balanced]
    pairs = [pair_of(a)[0] for a in arrangements_of] if reordered else []
    signs = sign_aligned(arrangements_of, [1.0] * len(balanced)) if reordered else None
    aligned = [
        (hypothesis, quantity, sign_aligned(arrangements_of, values) if reordered else values)
        for hypothesis, quantity, values in checks
    ]
    if reordered:  # the paper's comparison first, then every pair pooled
        for hypothesis, quantity, values in aligned:
            paper_values = [v for v, p in zip(values, pairs, strict=True) if p == PAPER_PAIR]
            if paper_values:
                evidence.decide(
                    f"reordered {PAPER_PAIR} (the paper's comparison): {hypothesis}",
                    f"{quantity}_fftt_ttff",
                    stats.bootstrap_mean(paper_values),
                    min_effect=0.05 if quantity == "accuracy_drop" else 0.02,
                )
    arrangement_rows: dict[str, Row] = {}
    pair_rows: dict[str, Row] = {}
    for hypothesis, quantity, values in aligned:
        evidence.decide(
            f"reordered, each arrangement vs its mirror (sign-aligned, pooled): {hypothesis}"
            if reordered
            else f"{variant}: {hypothesis}",
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
            if reordered:
                row["pair"] = pair_of(arrangement)[0]
            row.update(
                evidence.cell(
                    "by_arrangement", arrangement, quantity, stats.bootstrap_mean(members)
                )
            )
        by_pair: dict[str, list[float]] = {}
        for p, v in zip(pairs, values, strict=False):
            by_pair.setdefault(p, []).append(v)
        for pair in sorted(by_pair, key=lambda p: (p != PAPER_PAIR, p)):
            row = pair_rows.setdefault(pair, {"pair": pair, "n": len(by_pair[pair])})
            row.update(
                evidence.cell("by_mirror_pair", pair, quantity, stats.bootstrap_mean(by_pair[pair]))
            )
    arrangements = list(arrangement_rows.values())
    top = location.top(TOP)
    rates = _head_rates(evidence, variant, balanced, changed, top, control, signs=signs)
    if reordered:
        paper_set = [i for i, p in enumerate(pairs) if p == PAPER_PAIR]
        _head_rates(
            evidence,
            f"reordered {PAPER_PAIR} (the paper's comparison)",
            [balanced[i] for i in paper_set],
            [changed[i] for i in paper_set],
            top,
            None,
            suffix="_fftt_ttff",
        )
    metrics.update({name: found.estimate for name, found in rates.items()})
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
            "\n### Per demonstration arrangement of the balanced prompt (paired changes"
            + (
                ", sign-aligned: each read from its pair's first arrangement)\n"
                if reordered
                else ")\n"
            ),
            table(arrangements),
            *(
                [
                    "\n### Per mirror pair (sign-aligned; the paper's FFTT → TTFF first)\n",
                    table(list(pair_rows.values())),
                ]
                if reordered
                else []
            ),
            "",
            comparison(
                [
                    (
                        f"attention on true labels, balanced → {variant}",
                        expected,
                        f"in-context heads {metrics['located_attn_true_balanced']:.3f} → "
                        f"{metrics[f'located_attn_true_{variant}']:.3f}; drops in {true_drops} of "
                        f"the top {len(top_rows)} heads"
                        + _rate_text(rates.get(f"top{TOP}_true_attention_drop_rate")),
                    ),
                    (
                        f"attention on false labels, balanced → {variant}",
                        "rises (imbalanced)" if variant == "imbalanced" else "—",
                        f"in-context heads {metrics['located_attn_false_balanced']:.3f} → "
                        f"{metrics[f'located_attn_false_{variant}']:.3f}; rises in {false_rises} "
                        f"of the top {len(top_rows)} heads"
                        + _rate_text(rates.get(f"top{TOP}_false_attention_rise_rate")),
                    ),
                ]
            ),
        ]
    )
    tables = {"attention": rows, "by_arrangement": arrangements, "location": location.candidates}
    if reordered:
        tables["by_mirror_pair"] = list(pair_rows.values())
    return ctx.result(
        metrics,
        tables,
        figures,
        report,
        evidence,
    )


#: how a head's change is measured (see head_changes)
Kind = Literal["raw", "per_label", "kept", "vs_control"]


def _count(run: PromptRun, side: str) -> int:
    """How many demonstrations of `side` (`T` true, `F` false) the prompt has (at least 1)."""
    return max(1, run.item.prompt.arrangement.count(side))


def kept_true(run: PromptRun, head: Head) -> float:
    """Attention of `head` on the true labels of a balanced prompt except the one its
    imbalanced variant drops (the true demonstration nearest the input)."""
    if run.attn_labels is None:
        raise ValueError("the run has no per-label attention")
    sides = "".join("T" if t else "F" for t in run.item.label_true)
    dropped = sides.rindex("T")
    kept = [i for i, side in enumerate(sides) if side == "T" and i != dropped]
    return float(run.attn_labels[head][kept].sum()) if kept else 0.0


def head_changes(
    balanced: Sequence[PromptRun],
    changed: Sequence[PromptRun],
    heads: Sequence[Head],
    true: bool,
    *,
    kind: Kind = "raw",
    control: Sequence[PromptRun] | None = None,
) -> list[list[float]]:
    """[n prompts, heads]: per prompt (balanced[i] and its variant changed[i]) and head, the
    true-label attention drop (`true`: balanced − variant) or the false-label attention rise
    (variant − balanced), measured as `kind`:

    - "raw": the attention summed over the labels (a prompt that loses a true demonstration
      loses that label's attention by construction);
    - "per_label": each sum divided by its number of labels;
    - "kept" (true side, imbalanced): the balanced sum over the true labels the variant keeps
      (the same demonstrations, at the same positions) minus the variant's; attention freed by
      the dropped label and spread over the rest pushes it *down*, so a positive value is
      conservative;
    - "vs_control": the raw change minus the `control`'s (the same prompts with the false
      demonstration nearest the input dropped) change of the other side: balanced − control
      false-label attention for a true drop. Zero when dropping a demonstration costs its
      label the same attention whether that label is true or false, including when a
      majority effect hits both alike.
    """
    if kind == "vs_control" and control is None:
        raise ValueError("kind 'vs_control' needs the control runs")

    def attention(r: PromptRun, on_true: bool, head: Head) -> float:
        value = float((r.attn_true if on_true else r.attn_false)[head])
        if kind == "per_label":
            return value / _count(r, "T" if on_true else "F")
        return value

    rows = []
    for i, (b, c) in enumerate(zip(balanced, changed, strict=True)):
        row = []
        for head in heads:
            if true:
                before = kept_true(b, head) if kind == "kept" else attention(b, True, head)
                found = before - attention(c, True, head)
            else:
                found = attention(c, False, head) - attention(b, False, head)
            if kind == "vs_control" and control is not None:
                k = control[i]
                found -= (
                    attention(b, False, head) - attention(k, False, head)
                    if true
                    else attention(k, True, head) - attention(b, True, head)
                )
            row.append(found)
        rows.append(row)
    return rows


def _head_rates(
    evidence: Evidence,
    variant: str,
    balanced: Sequence[PromptRun],
    changed: Sequence[PromptRun],
    heads: Sequence[Head],
    control: Sequence[PromptRun] | None,
    *,
    signs: Sequence[float] | None = None,
    suffix: str = "",
) -> dict[str, stats.Interval]:
    """The share of the top heads whose true-label attention drops (false-label attention
    rises), with prompt-bootstrap intervals and verdicts against "more than half"; for the
    imbalanced prompts also the true-label drop per label occurrence, position-matched
    ("kept") and against the matched control. `signs`: per prompt, the sign that aligns its
    change (the reorder's mirror pairs); `suffix`: added to every quantity's name."""
    if not heads or not balanced:
        return {}
    above = stats.share_above(0.0)
    found: dict[str, stats.Interval] = {}
    kinds: list[tuple[Kind, bool, str]] = [("raw", True, ""), ("raw", False, "")]
    if control is not None:
        kinds += [
            ("per_label", True, " per label occurrence"),
            ("kept", True, " on the true label that stays (position-matched)"),
            ("vs_control", True, " more than false-label attention in the matched control"),
        ]
    for kind, true, words in kinds:
        rows = head_changes(balanced, changed, heads, true, kind=kind, control=control)
        if signs is not None:
            rows = [[v * s for v in row] for row, s in zip(rows, signs, strict=True)]
        what, verb = ("true", "drop") if true else ("false", "rise")
        how = "" if kind == "raw" else f"_{kind}"
        quantity = f"top{TOP}_{what}_attention_{verb}_rate{how}{suffix}"
        share = stats.bootstrap_over_heads(rows, above)
        found[quantity] = evidence.add(quantity, share)
        evidence.decide(
            f"{variant}: {what}-label attention {verb}s{words} in more than half of the "
            f"top {len(heads)} heads by increase",
            f"{quantity}_minus_half",
            share.shifted(MOST),
            min_effect=0.1,
        )
    return found


def _rate_text(found: stats.Interval | None) -> str:
    """` (share 0.85 [0.7, 0.95], 95% prompt bootstrap)`, or nothing."""
    return "" if found is None else f" (share {found.text()}, 95% {found.method})"
