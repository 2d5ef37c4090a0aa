"""`docs/results.md`, generated from stored experiment outputs (torch-free).

`store(result, folder)` writes one experiment's result (seeds combined) as a small JSON file,
without figures or report; `render(folder)` turns every stored file into the Markdown document,
deterministically (same files → same bytes): every number in it comes from a stored file, every
verdict from the rule written beside it (seeds pooled: model_worker.experiments.seeds), and the
summary says which of the paper's claims the model supports, contradicts or cannot test, apart
from the findings about the model that the paper does not claim.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from model_worker.contracts.experiments import EXPERIMENT_NAMES, ExperimentResult
from model_worker.experiments import paper
from model_worker.experiments.evidence import RULE_TEXT
from model_worker.experiments.seeds import COMBINED_RULE, VOTE_RULE

#: tables too large for the stored file (one row per point), left out
LEFT_OUT = ("subheadvalues",)

TITLES = {
    "accuracy": "1. ICL accuracy (paper Table 2)",
    "heads": "2. Where the in-context heads are (Fig. 3/4)",
    "mrr": "3. Label-value MRR, located vs random heads (Fig. 5)",
    "attention": "4. Attention on true vs false labels (Fig. 6, 7)",
    "layers": "4b. Attention vs FFN layers over the dataset (Fig. 2)",
    "flow": "4c. Information flow per layer (Fig. 1a)",
    "matching": "4d. Matching test of the metric",
    "imbalance": "5a. Imbalanced prompts (Fig. 8/10)",
    "reorder": "5b. Reordered prompts (Fig. 9/11)",
    "ablation": "6. Zeroing the in-context heads (later paper version)",
    "bias": "7. Bias reduction (later paper version)",
}

#: (claim, what the paper reports, experiment, verdict quantity): the paper's claims;
#: `unverified` numbers come from public summaries of the later (EMNLP 2024) version, not
#: checked against its PDF
CLAIMS: tuple[tuple[str, str, str, str], ...] = (
    ("ICL solves the word tasks", "87–100% (GPT2-large)", "accuracy", "accuracy_minus_chance"),
    (
        "in-context heads' label values rank the labels high (MRR ≫ random heads)",
        paper.MRR,
        "mrr",
        "mrr_located_minus_random",
    ),
    (
        "attention on true labels ≫ on false labels",
        paper.ATTENTION,
        "attention",
        "attn_true_minus_false",
    ),
    (
        "deep attention layers carry the label (Fig. 2)",
        '"almost all" the increase',
        "layers",
        "deep_attention_minus_deep_ffn",
    ),
    (
        "shallow layers: demonstrations → labels (attention, sink excluded)",
        "Fig. 1a (Wang et al.)",
        "flow",
        "demo_to_label_nosink_shallow_minus_deep",
    ),
    (
        "deep layers: labels → last token (attention, sink excluded)",
        "Fig. 1a (Wang et al.)",
        "flow",
        "label_to_last_nosink_deep_minus_shallow",
    ),
    (
        "shallow layers: demonstrations → labels (saliency)",
        "Wang et al.'s S_wp",
        "flow",
        "saliency_demo_to_label_shallow_minus_deep",
    ),
    (
        "deep layers: labels → last token (saliency)",
        "Wang et al.'s S_pq",
        "flow",
        "saliency_label_to_last_deep_minus_shallow",
    ),
    (
        "query/key measure input–demonstration similarity (matching test)",
        "hypothesis",
        "matching",
        "located_own_label_minus_chance",
    ),
    (
        "the top-20 heads lie in the deep layers (Fig. 3/4; measured: deep share − ½)",
        "GPT2-large: top-20 heads all in deep layers 18–35 (of 36)",
        "heads",
        "top20_deep_share_minus_half",
    ),
    (
        "the top-20 heads are similar on both datasets (measured: overlap share − chance)",
        "GPT2-large: similar head indexes on both datasets",
        "heads",
        "top20_overlap_share_minus_chance",
    ),
    (
        "imbalanced prompts lower the located heads' true-label attention (position-matched: "
        "the true label that stays, so nothing falls by construction)",
        paper.IMBALANCE,
        "imbalance",
        "located_attn_true_drop_kept",
    ),
    (
        "… the raw drop of the summed true-label attention (partly mechanical: one true "
        "label fewer)",
        paper.IMBALANCE,
        "imbalance",
        "located_attn_true_drop",
    ),
    (
        "imbalanced prompts: true-label attention drops in most of the top-20 heads "
        "(position-matched; rate over heads)",
        paper.IMBALANCE,
        "imbalance",
        "top20_true_attention_drop_rate_kept_minus_half",
    ),
    (
        "imbalanced prompts: false-label attention rises in most of the top-20 heads "
        "(rate over heads)",
        paper.IMBALANCE,
        "imbalance",
        "top20_false_attention_rise_rate_minus_half",
    ),
    (
        "reordered prompts lower the located heads' true-label attention (FFTT → TTFF, the "
        "paper's comparison)",
        paper.REORDER,
        "reorder",
        "located_attn_true_drop_fftt_ttff",
    ),
    (
        "… every arrangement against its mirror, sign-aligned (FFTT → TTFF, FTFT → TFTF, "
        "TFFT → FTTF pooled)",
        paper.REORDER,
        "reorder",
        "located_attn_true_drop",
    ),
    (
        "reordered prompts (FFTT → TTFF): true-label attention drops in most of the top-20 "
        "heads (rate over heads)",
        paper.REORDER,
        "reorder",
        "top20_true_attention_drop_rate_fftt_ttff_minus_half",
    ),
    (
        "… every arrangement against its mirror, sign-aligned (rate over heads)",
        paper.REORDER,
        "reorder",
        "top20_true_attention_drop_rate_minus_half",
    ),
    (
        "zeroing ~1% of heads (the located ones; the later version's share, unverified) "
        "hurts more than random heads",
        f"{paper.ABLATION_BEFORE:.1%} → {paper.ABLATION_AFTER:.1%} on Llama-7B "
        "(later version, unverified)",
        "ablation",
        "accuracy_random_minus_in_context_zeroed",
    ),
    (
        "majority-label bias reduction through the located heads (a_c = 0.03, the later "
        "version's constant, unverified)",
        f"{paper.MAJORITY_REDUCTION:.0%} on average (later version, unverified)",
        "bias",
        "majority_reduction",
    ),
    (
        "recency bias reduction (SD of accuracy across orders)",
        f"{paper.RECENCY_REDUCTION:.0%} on average (later version, unverified)",
        "bias",
        "recency_reduction",
    ),
)

#: (finding, experiment, verdict quantity): measured here, not claimed by the paper (which
#: reports order sensitivity itself, Fig. 9/11): findings about the model, kept apart from the
#: paper's claims and never said to support or contradict it
FINDINGS: tuple[tuple[str, str, str], ...] = (
    (
        "the model answers from position: more accurate when the demonstration nearest the "
        "input is true",
        "accuracy",
        "accuracy_true_nearest_minus_false_nearest",
    ),
    (
        "losing a true demonstration costs more true-label attention than losing a false one "
        "costs false-label attention (matched control)",
        "imbalance",
        "located_attn_true_drop_vs_control",
    ),
    (
        "majority-bias reduction beats adding the minority label (net gain with the control, "
        "a_c = 0.03)",
        "bias",
        "net_gain_ac0.03",
    ),
)

PREAMBLE = """\
# Reproducing the paper's dataset experiments on SmolLM2-135M

<!-- Generated by `python scripts/results.py render` from docs/results/*.json: do not edit;
edit icl_heads/results_doc.py or rerun the experiments instead. -->

Yu & Ananiadou, *How do Large Language Models Learn In-Context? Query and Key Matrices of
In-Context Heads are Two Towers for Metric Learning*, report their experiments on GPT2-large,
Llama and (later version) GPT-J. Here every experiment is rerun on the model named in each
section (SmolLM2-135M-Instruct: 30 layers × 9 query heads), CPU only, with
`python scripts/results.py run NAME … --seeds 0,1,2 --n N` (the same runner as
`icl-heads experiment`), which stores each experiment's result, seeds combined, in
`docs/results/NAME.json`; this document is rendered from those files alone.

**Design.** Prompts are counterbalanced unless a section says otherwise: every order of the two
true (T) and two false (F) demonstrations — FFTT, FTFT, FTTF, TFFT, TFTF, TTFF — comes equally
often, each with both label assignments (`foo`/`bar`) and both input classes. The paper's
design puts the true demonstrations nearest the input (FFTT) in every prompt, which lets a
model score well by copying the nearest label; it stays available as `--design fftt`.

**Uncertainty.** Every accuracy, rate, mean, difference and reduction carries a 95% interval:
exact binomial (Clopper–Pearson) for accuracies and rates, otherwise a percentile bootstrap
over prompts (2,000 resamples, fixed seed; paired when two conditions share prompts). Between
seeds (other evaluation and location prompts) each metric's mean, SD, min and max are given.
Rates over heads (the share of the top-20 heads whose attention drops) and the overlap of two
datasets' top 20 are statistics of per-head means: their intervals resample the prompts and
recompute every head's mean, then the rate or overlap (method "prompt bootstrap").
An interval the data cannot support is shown as undefined, with the reason, never as [x, x]:
a bootstrap whose statistic is defined in fewer than half the resamples, or whose prompts all
give the same value (a change that is zero on every prompt; results stored before this rule
held such intervals as [0, 0]: they are shown undefined, and their verdicts inconclusive). A
rate over heads can be the same in every resample and keep its interval. With few prompts the
percentile bootstrap understates the uncertainty, so read the verdicts of small-n sections as
indicative.

**Verdicts.** Seeds are more prompts: each hypothesis is decided from its interval over all
prompts of all seeds ({combined}). The rule: {rule} Each seed's own verdict is shown beside the
pooled one as a stability check; it does not vote. A result stored before seeds were pooled
(its verdicts combined by "every seed must agree") has no pooled interval: its verdicts are
shown as not decided until it is rerun. Every interval says whose prompts it is over ("prompts
of"); a per-arrangement or per-mirror-pair table says "seeds … pooled" when its rows pool every
seed's prompts (the stored result records which tables do), else "seed 0" (one seed, or a
result stored before tables were pooled); the located heads are always the first seed's (each
seed locates its own).

**Model adequacy.** Before head-level claims, each experiment checks that the model does the
task above chance under counterbalanced order (the accuracy interval's lower bound above 50%,
seeds pooled); when it does not, its head-level verdicts are not findings: they are shown as
"not a finding", with the measurement alone beside them. The summary gates every claim but the
accuracy ones on the accuracy experiment's pooled verdict (its sample is the largest).

Numbers marked *(later version, unverified)* come from public summaries of the later (EMNLP
2024) version of the paper and were not checked against its PDF.
"""


def store(
    result: ExperimentResult, folder: Path, run: dict[str, str | int | float | None] | None = None
) -> Path:
    """Write `result` without figures, report and the per-point tables to
    `folder/<name>.json` (sorted keys: the same result gives the same bytes), with `run`
    (how it ran: command, CPU, load, seconds) under the key "run" when given."""
    data = result.model_dump(mode="json", exclude={"figures", "report"})
    data["tables"] = {k: v for k, v in data["tables"].items() if k not in LEFT_OUT}
    if run is not None:
        data["run"] = run
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{result.name}.json"
    path.write_text(json.dumps(data, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    return path


def _num(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value).replace("|", "\\|")


def _interval(interval: dict[str, Any]) -> str:
    """`0.42 [0.31, 0.55]`; bounds the data cannot support: `0.42 [undefined: why]`."""
    if interval.get("low") is None or interval.get("high") is None:
        why = interval.get("undefined")
        return f"{_num(interval['estimate'])} [undefined{': ' + why if why else ''}]"
    return f"{_num(interval['estimate'])} [{_num(interval['low'])}, {_num(interval['high'])}]"


def _pooled(data: dict[str, Any], verdict: dict[str, Any]) -> bool:
    """Was `verdict` decided from its interval over every seed's prompts (not a stored vote)?
    A result of one seed is: its prompts are all the prompts, whichever rule it was stored
    under."""
    return len(data.get("seeds") or [data["seed"]]) <= 1 or not verdict["rule"].startswith(
        VOTE_RULE
    )


def _gated(data: dict[str, Any], verdict: dict[str, Any]) -> bool:
    """Is `verdict` a head-level claim behind its experiment's failed adequacy gate?"""
    adequacy = data.get("adequacy")
    needs = verdict.get("needs_adequacy", data["name"] != "accuracy")
    return bool(needs and adequacy is not None and not adequacy["adequate"])


def _outcome_cell(data: dict[str, Any], verdict: dict[str, Any]) -> str:
    """A verdict as the document shows it: settled only when pooled and not behind a failed
    gate."""
    if not _pooled(data, verdict):
        return "not decided: stored before seeds were pooled (rerun)"
    if _gated(data, verdict):
        return (
            f"not a finding: the model fails the adequacy gate (the measurement alone: "
            f"{verdict['outcome']})"
        )
    return f"**{verdict['outcome']}**"


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_num(row.get(c)) for c in columns) + " |" for row in rows]
    return lines


def _by_seed(data: dict[str, Any], quantity: str) -> str:
    rows = [r for r in data["tables"].get("verdicts_by_seed", []) if r["quantity"] == quantity]
    return "; ".join(
        f"seed {r['seed']}: {_num(r['estimate'])} [{_num(r['low'])}, {_num(r['high'])}] "
        f"{r['outcome']}"
        for r in rows
    )


#: what a section's quantities mean, where their names do not say it
NOTES = {
    "heads": (
        "`top20_overlap_share`: the share of this dataset's top 20 heads that are also in the "
        "other built-in dataset's top 20 (each dataset's prompts resampled on its own, both top "
        "20s re-ranked in every resample); chance is 20 / (layers × heads)."
    ),
    "attention": (
        "`spearman_attention_increase`: Spearman's ρ between a top-3 head's attention on a true "
        "label and that label's log-probability increase, over (prompt, head, label) points, its "
        "interval resampling whole prompts. A result stored before its prompts' points were kept "
        'gives it over the first seed\'s prompts alone ("prompts of": seed 0).'
    ),
    "imbalance": (
        "The imbalanced prompt drops the true demonstration nearest the input, so the summed "
        "true-label attention (`located_attn_true_drop`, `top20_true_attention_drop_rate`) "
        "falls partly by construction. `…_per_label` divides each sum by its number of true "
        "labels; `…_kept` compares the attention on the true label that stays, at the same "
        "position in both prompts (nothing falls by construction; attention freed by the "
        "dropped label pushes it down, so a positive drop is conservative); `…_vs_control` "
        "subtracts the false-label drop of the matched control (the same prompts with the "
        "false demonstration nearest the input dropped instead): 0 for heads that treat true "
        "and false labels alike. `top20_…_rate…`: the share of the top 20 heads by increase "
        "whose change goes the stated way, resampling prompts."
    ),
    "ablation": (
        "The located set is about 1% of the heads (2·⌈0.5% of layers × heads⌉: 4 of 270 on "
        "SmolLM2), after the later version's 12 of 1,024 on Llama-7B (later version, "
        "unverified); the random baselines zero as many distinct heads, several draws."
    ),
    "bias": (
        "a_c = 0.03 is the later version's amplification constant (later version, "
        "unverified); 0.3 and 1 are added here to show the method's scale. The control "
        "prompts make the minority label the wrong answer."
    ),
    "reorder": (
        "Reordering swaps the true and false slots, which maps the six arrangements onto each "
        "other in mirror pairs (FFTT↔TTFF, FTFT↔TFTF, TFFT↔FTTF): over counterbalanced prompts "
        "a raw balanced − reordered change sums each pair in both directions and cancels by "
        "construction. Each change is therefore read in the paper's direction, from the "
        "arrangement whose demonstration nearest the input is true to its mirror "
        "(sign-aligned); `…_fftt_ttff` is the paper's comparison alone, the unsuffixed "
        "quantities pool every pair, and `by_mirror_pair` lists each pair. `top20_…_rate`: the "
        "share of the top 20 heads by increase whose true-label attention drops (false-label "
        "attention rises), resampling prompts."
    ),
}


def _which(interval: dict[str, Any], seed: int) -> str:
    """`seeds 0, 1 pooled`, or `seed 0` (an interval one run gave, or one seed's prompts)."""
    seeds = interval.get("seeds") or []
    return f"seeds {', '.join(map(str, seeds))} pooled" if len(seeds) > 1 else f"seed {seed}"


#: what each label style puts after the demonstrations
LABEL_WORDS = {"arbitrary": "foo/bar", "meaningful": "each class's own name"}


def design_options(data: dict[str, Any]) -> tuple[int, str]:
    """The stored result's demonstrations per label and label style; a result stored before
    it recorded them ran the only design there was then (the contract's defaults)."""
    fields = ExperimentResult.model_fields
    return (
        int(data.get("demos_per_label", fields["demos_per_label"].default)),
        str(data.get("labels", fields["labels"].default)),
    )


def _design_text(data: dict[str, Any]) -> str:
    """`design counterbalanced, 2 demonstrations per label (4 in all), labels arbitrary
    (foo/bar)`."""
    per_label, labels = design_options(data)
    return (
        f"design {data['design']}, {per_label} demonstrations per label ({2 * per_label} in "
        f"all), labels {labels} ({LABEL_WORDS.get(labels, labels)})"
    )


def _design_flags(data: dict[str, Any]) -> str:
    """The command-line options that give the stored result's design beyond the default."""
    per_label, labels = design_options(data)
    fields = ExperimentResult.model_fields
    return (
        f" --demos-per-label {per_label}" if per_label != fields["demos_per_label"].default else ""
    ) + (f" --labels {labels}" if labels != fields["labels"].default else "")


def _seeds_of_table(data: dict[str, Any], table: str) -> str:
    """`seeds 0, 1 pooled` when the stored table pools every seed's prompts, else `seed 0`
    (one seed; or a table the result marks, or a result stored before it marked any, as the
    first seed's alone)."""
    seeds = data.get("seeds") or [data["seed"]]
    if (
        len(seeds) > 1
        and "first_seed_only" in data
        and f"tables.{table}" not in data["first_seed_only"]
    ):
        return f"seeds {', '.join(map(str, seeds))} pooled"
    return f"seed {data['seed']}"


def section(data: dict[str, Any]) -> list[str]:
    """The Markdown lines of one stored experiment."""
    seeds = data.get("seeds") or [data["seed"]]
    lines = [
        f"## {TITLES.get(data['name'], data['name'])}",
        "",
        f"Run: `{data['name']}` on {_num(data['model'])}, dataset {_num(data['dataset'])}, "
        f"{_design_text(data)}, n = {data['n']} per prompt set, seeds "
        f"{', '.join(map(str, seeds))}.",
        "",
    ]
    if data["name"] in NOTES:
        lines += [NOTES[data["name"]], ""]
    adequacy = data.get("adequacy")
    if adequacy:
        which = _which(adequacy["accuracy"], data["seed"])
        lines += [f"**Model adequacy ({which}).** {adequacy['note']}", ""]
    if data["verdicts"]:
        lines += [
            "| hypothesis | all seeds pooled [95% interval] | each seed alone (stability "
            "check) | verdict |"
        ]
        lines += ["|---|---|---|---|"]
        for v in data["verdicts"]:
            measured = (
                _interval(v["interval"])
                if _pooled(data, v)
                else "— (stored before seeds were pooled)"
            )
            lines.append(
                f"| {_num(v['hypothesis'])} (`{v['quantity']}`; null {v['null']:g}, smallest "
                f"effect {v['min_effect']:g}) | {measured} | "
                f"{_by_seed(data, v['quantity']) or '—'} | {_outcome_cell(data, v)} |"
            )
        lines.append("")
    spread = data.get("seed_spread", {})
    if data["intervals"]:
        lines += [
            "| quantity | estimate [95% interval] | prompts of | method | n | across seeds: "
            "mean ± SD (min–max) |",
            "|---|---|---|---|---|---|",
        ]
        for name, interval in sorted(data["intervals"].items()):
            across = spread.get(name)
            seen = (
                f"{_num(across['mean'])} ± {_num(across['sd'])} ({_num(across['min'])}–"
                f"{_num(across['max'])})"
                if across and len(seeds) > 1
                else "—"
            )
            lines.append(
                f"| `{name}` | {_interval(interval)} | {_which(interval, data['seed'])} | "
                f"{interval['method']} | {interval['n']} | {seen} |"
            )
        lines.append("")
    arrangements = data["tables"].get("by_arrangement")
    if arrangements:
        lines += [f"Per demonstration arrangement ({_seeds_of_table(data, 'by_arrangement')}):", ""]
        first = ["arrangement", "n"]
        lines += _table(arrangements, first + [c for c in arrangements[0] if c not in first])
        lines.append("")
    mirrored = data["tables"].get("by_mirror_pair")
    if mirrored:
        lines += [f"Per mirror pair, sign-aligned ({_seeds_of_table(data, 'by_mirror_pair')}):", ""]
        first = ["pair", "n"]
        lines += _table(mirrored, first + [c for c in mirrored[0] if c not in first])
        lines.append("")
    lines += _location(data)
    return lines


LOCATION_COLUMNS = (
    "label",
    "head",
    "mean_increase",
    "label_share",
    "accuracy_drop",
    "accuracy_drop_low",
    "accuracy_drop_high",
    "located",
)


def _location(data: dict[str, Any]) -> list[str]:
    """The located heads: those that pass the drop criterion, else a sentence saying none
    does and which heads the experiment studies instead (the largest increase alone)."""
    rows = data["tables"].get("location", [])
    passing = [r for r in rows if r.get("located") == "yes"]
    instead = [r for r in rows if r.get("located") not in ("yes", "no", None)]
    seed = data["seed"]
    lines: list[str] = []
    if passing:
        lines += [
            f"Located heads (seed {seed}; they pass the rule: zeroing one alone drops accuracy, "
            "the drop's 95% interval above 0):",
            "",
            *_table(passing, LOCATION_COLUMNS),
            "",
        ]
    elif rows:
        lines += [f"**No head passes the drop criterion (seed {seed}).**", ""]
    if instead:
        labels = sorted({str(r["label"]) for r in instead})
        lines += [
            f"For {', '.join(f'`{label}`' for label in labels)} no candidate passes the rule: "
            f"the experiment studies instead the candidates with the largest increase alone "
            f"(seed {seed}; they fail the rule, so they are not located heads):",
            "",
            *_table(instead, LOCATION_COLUMNS),
            "",
        ]
    return lines


def _verdict_of(
    stored: dict[str, dict[str, Any]], name: str, quantity: str
) -> dict[str, Any] | None:
    data = stored.get(name)
    if data is None:
        return None
    return next((v for v in data["verdicts"] if v["quantity"] == quantity), None)


def _no_paper_pair(data: dict[str, Any], quantity: str) -> bool:
    """Is `quantity` the paper's FFTT → TTFF comparison, absent because the stored design has
    more than two demonstrations per label (so no FFTT arrangement)?"""
    return "fftt_ttff" in quantity and design_options(data)[0] != 2


def _claim_row(claim: tuple[str, str, str, str], stored: dict[str, dict[str, Any]]) -> str:
    text, reported, name, quantity = claim
    found = _verdict_of(stored, name, quantity)
    if found is None and name in stored and _no_paper_pair(stored[name], quantity):
        per_label, _ = design_options(stored[name])
        return (
            f"| {text} | {reported} | `{quantity}`: no FFTT or TTFF arrangement among "
            f"{2 * per_label} demonstrations (the pooled mirror pairs below stand for it) | "
            "cannot test (no such arrangement in this design) |"
        )
    if found is None and name in stored:
        return (
            f"| {text} | {reported} | `{quantity}` not in the stored result (stored before it "
            "existed) | cannot test (rerun) |"
        )
    if found is None:
        return f"| {text} | {reported} | not run | cannot test (not run) |"
    data = stored[name]
    if not _pooled(data, found):
        return (
            f"| {text} | {reported} | `{quantity}`: stored before seeds were pooled | "
            "**cannot test: not decided (rerun to pool the seeds)** |"
        )
    measured = _interval(found["interval"])
    word = {
        "supported": "supports",
        "not supported": "contradicts",
        "inconclusive": "cannot test at this n (inconclusive)",
    }[found["outcome"]]
    if found["interval"].get("undefined"):  # no n would do: the data cannot support one
        word = "cannot test (no interval: see why beside the measure)"
    if name != "accuracy" and not _adequate(stored, data):
        word = (
            "cannot test: the model is not shown to do ICL on the task under counterbalanced "
            f"order (the measurement alone: {found['outcome']})"
        )
    return f"| {text} | {reported} | `{quantity}` = {measured} | **{word}** |"


def _finding_row(finding: tuple[str, str, str], stored: dict[str, dict[str, Any]]) -> str:
    text, name, quantity = finding
    found = _verdict_of(stored, name, quantity)
    if found is None:
        return f"| {text} | {'not in the stored result' if name in stored else 'not run'} | — |"
    if not _pooled(stored[name], found):
        return f"| {text} | `{quantity}`: stored before seeds were pooled | not decided |"
    cell = _outcome_cell(stored[name], found)
    if name != "accuracy" and not _adequate(stored, stored[name]):
        cell = (
            f"not a finding: behind the adequacy gate (the measurement alone: {found['outcome']})"
        )
    return f"| {text} | `{quantity}` = {_interval(found['interval'])} | {cell} |"


def _how_it_ran(run: dict[str, Any] | None) -> str:
    """`; 1,234 s wall (456 s CPU), Intel …, 2 cores, nice 15, load 9.9 → 10.2, 2026-… UTC`
    from a stored result's "run" (results stored without it: says so)."""
    if not run:
        return "; stored by an earlier run that recorded no run details"
    return (
        f"; {run.get('wall_s', '?')} s wall ({run.get('cpu_s', '?')} s CPU) on "
        f"{run.get('cpu', '?')}, {run.get('cores', '?')} cores shared with other work, nice "
        f"{run.get('nice', '?')}, load average {run.get('load_before', '?')} → "
        f"{run.get('load_after', '?')}, finished {run.get('finished', '?')}"
    )


#: the precision the issue asks for: 95% intervals of ±5 points (0.05 on a 0–1 scale)
TARGET_HALF_WIDTH = 0.05
#: quantities not on a 0–1 scale (log-probabilities, ratios), left out of the ±5-point list
NOT_UNIT_SCALE = ("deep_attention_minus_deep_ffn", "majority_reduction", "recency_reduction")


def precision(stored: Sequence[dict[str, Any]]) -> list[str]:
    """The section "Sample sizes and precision": per experiment its n and seeds, and which
    verdict intervals (pooled; stored before pooling: first seed) are wider than ±5 points,
    with their half-widths."""
    lines = [
        "## Sample sizes and precision",
        "",
        "The issue asks for n large enough for 95% intervals of ±5 points (±0.05 on a 0–1 "
        "scale) where the machine allows. These runs had one shared machine (2 CPU cores, "
        "shared with other sessions; see each run's load above) and about an hour of background "
        "compute at low priority, so the head-level experiments ran far fewer prompts than "
        "that needs: an accuracy near 50% needs about 385 prompts for ±5 points (exact "
        "binomial), a paired accuracy difference more. Verdict intervals wider than ±5 points "
        "(seeds pooled; a result stored before pooling: its first seed; quantities on a 0–1 "
        "scale) are listed; their verdicts are the ones most "
        "likely to change with more prompts.",
        "",
        "| experiment | prompts per set | seeds | verdict intervals wider than ±5 points "
        "(half-width) |",
        "|---|---|---|---|",
    ]
    for data in stored:
        wide = []
        for v in data["verdicts"]:
            interval = v["interval"]
            if interval["low"] is None or interval["high"] is None:
                continue
            if any(v["quantity"].startswith(name) for name in NOT_UNIT_SCALE):
                continue
            half = (interval["high"] - interval["low"]) / 2
            if half > TARGET_HALF_WIDTH:
                wide.append(f"`{v['quantity']}` (±{half:.3f})")
        seeds = ", ".join(map(str, data.get("seeds") or [data["seed"]]))
        lines.append(
            f"| `{data['name']}` | {data['n']} | {seeds} | "
            f"{'; '.join(wide) if wide else 'none: every one within ±5 points'} |"
        )
    lines.append("")
    return lines


def _stale(stored: Sequence[dict[str, Any]]) -> list[str]:
    """A paragraph naming the results stored before seeds were pooled (several seeds, verdicts
    combined by vote): their verdicts stay undecided until rerun, with the time it took."""
    stale = [
        data
        for data in stored
        if data["verdicts"] and not all(_pooled(data, v) for v in data["verdicts"])
    ]
    if not stale:
        return []
    took = [int((data.get("run") or {}).get("wall_s") or 0) for data in stale]
    names = ", ".join(
        f"`{data['name']}` ({seconds} s)" if seconds else f"`{data['name']}`"
        for data, seconds in zip(stale, took, strict=True)
    )
    return [
        f"**Stored before seeds were pooled**: {names}. Their verdicts were combined by "
        '"every seed must agree" and their per-prompt values were not kept, so they are shown '
        "as not decided; rerunning them with the commands above (about "
        f"{sum(took)} s of wall time altogether when they last ran, on the machine and load "
        "stated) stores pooled verdicts.",
        "",
    ]


def _adequate(stored: dict[str, dict[str, Any]], data: dict[str, Any]) -> bool:
    """The gate for head-level claims: the accuracy experiment's pooled verdict that the model
    does the task above chance (its largest sample), else the experiment's own gate."""
    accuracy = stored.get("accuracy")
    if accuracy is not None:
        return any(
            v["quantity"] == "accuracy_minus_chance"
            and _pooled(accuracy, v)
            and v["outcome"] == "supported"
            for v in accuracy["verdicts"]
        )
    adequacy = data.get("adequacy")
    return adequacy is None or bool(adequacy["adequate"])


#: methods whose zero-width interval means every prompt gave the same value (a percentile
#: bootstrap of a mean, a difference or a ratio); a rate over heads can be stable instead
ZERO_WIDTH_UNDEFINED = ("bootstrap", "paired bootstrap")
#: why a zero-width interval stored before such intervals were marked undefined is undefined
ZERO_WIDTH = "every prompt gives the same value (a zero-width bootstrap, stored as [x, x])"


def _degenerate(interval: dict[str, Any], method: str) -> bool:
    low, high = interval.get("low"), interval.get("high")
    return method in ZERO_WIDTH_UNDEFINED and low is not None and low == high


def normalised(data: dict[str, Any]) -> dict[str, Any]:
    """A stored result with its zero-width bootstrap intervals (stored before they were marked
    undefined) undefined, and the verdicts decided from them inconclusive, as the rule decides
    an undefined interval: an interval is never shown as [x, x]."""
    methods = {v["quantity"]: v["interval"]["method"] for v in data["verdicts"]}
    intervals = {
        name: (
            {**i, "low": None, "high": None, "undefined": ZERO_WIDTH}
            if _degenerate(i, i["method"])
            else i
        )
        for name, i in data["intervals"].items()
    }
    verdicts = [
        {
            **v,
            "interval": {**v["interval"], "low": None, "high": None, "undefined": ZERO_WIDTH},
            "outcome": "inconclusive",
        }
        if _degenerate(v["interval"], v["interval"]["method"])
        else v
        for v in data["verdicts"]
    ]
    rows = [
        {**r, "low": None, "high": None, "outcome": "inconclusive"}
        if _degenerate(r, methods.get(str(r["quantity"]), ""))
        else r
        for r in data["tables"].get("verdicts_by_seed", [])
    ]
    tables = {**data["tables"], "verdicts_by_seed": rows} if rows else data["tables"]
    return {**data, "intervals": intervals, "verdicts": verdicts, "tables": tables}


def render(folder: Path) -> str:
    """The whole document from every `folder/*.json` (sorted: deterministic)."""
    stored = {}
    for path in sorted(folder.glob("*.json")):
        data = normalised(json.loads(path.read_text(encoding="utf-8")))
        stored[data["name"]] = data
    lines = [PREAMBLE.format(rule=RULE_TEXT, combined=COMBINED_RULE.split(":")[0])]
    order = [name for name in TITLES if name in EXPERIMENT_NAMES]
    order += [name for name in EXPERIMENT_NAMES if name not in order]
    lines += ["## What was run", ""]
    for name in order:
        if name in stored:
            data = stored[name]
            seeds = ",".join(map(str, data.get("seeds") or [data["seed"]]))
            lines.append(
                f"- `{name}`: `scripts/results.py run {name}:{seeds} --n {data['n']} --dataset "
                f"{data['dataset']} --design {data['design']}{_design_flags(data)}` on "
                f"{_num(data['model'])}" + _how_it_ran(data.get("run"))
            )
    missing = [name for name in order if name not in stored]
    if missing:
        lines.append(f"- not run here: {', '.join(f'`{m}`' for m in missing)}")
    lines.append("")
    lines += _stale([stored[name] for name in order if name in stored])
    lines += precision([stored[name] for name in order if name in stored])
    for name in order:
        if name in stored:
            lines += section(stored[name])
    lines += [
        "## Summary: the paper's claims on this model",
        "",
        "Each claim's verdict is the pooled verdict of the quantity named (the interval over "
        "all prompts of all seeds); *supports* = supported, *contradicts* = not supported (the "
        "interval excludes an effect of the smallest size that matters, or points the other "
        "way), *cannot test* = inconclusive, not run, not decided, or the model fails the "
        "adequacy gate.",
        "",
        "| claim | paper | measured, seeds pooled [95% interval] | this model |",
        "|---|---|---|---|",
    ]
    rows = [_claim_row(claim, stored) for claim in CLAIMS]
    lines += rows
    counts = {
        word: sum(f"**{word}" in row or f"| {word}" in row for row in rows)
        for word in ("supports", "contradicts", "cannot test")
    }
    lines += [
        "",
        f"In words: of the {len(rows)} claims above, this model supports {counts['supports']}, "
        f"contradicts {counts['contradicts']} and cannot test {counts['cannot test']} "
        "(inconclusive at the n run, not run, or behind the adequacy gate: when the model is "
        "not shown to do the task above chance under counterbalanced order, a head-level "
        "result describes a model that is not doing ICL, whatever its own verdict).",
    ]
    lines += [
        "",
        "## Findings about this model that the paper does not claim",
        "",
        "Measured here as controls; they neither support nor contradict the paper (which "
        "reports order sensitivity itself, Fig. 9/11).",
        "",
        "| finding | measured, seeds pooled [95% interval] | verdict |",
        "|---|---|---|",
        *[_finding_row(finding, stored) for finding in FINDINGS],
    ]
    alone = {
        outcome: sum(f"the measurement alone: {outcome})" in row for row in rows)
        for outcome in ("supported", "not supported", "inconclusive")
    }
    if any(alone.values()):
        lines += [
            "",
            f"Behind the gate, the measurements alone: {alone['supported']} supported, "
            f"{alone['not supported']} not supported, {alone['inconclusive']} inconclusive — "
            "what the heads do on this model, not evidence for or against the paper's account "
            "of ICL.",
        ]
    return "\n".join(lines).rstrip() + "\n"


def document(folder: Path) -> str:
    """The document of a folder of stored results: its `preface.md`, if any (what its design
    changes from the paper's), then `render(folder)`."""
    preface = folder / "preface.md"
    text = preface.read_text(encoding="utf-8") + "\n" if preface.is_file() else ""
    return text + render(folder)
