"""Experiment `atlas`: the in-context heads beside the other head types the field has named,
one row per head, with Spearman correlations between the rankings and an ablation that zeroes
the top heads of one type while keeping those of another.

Scores per head (L·H rows):
- `in_context`: mean direct increase I(head | resid_pre) of the true label over the dataset's
  prompts (the ranking that locates the in-context heads); `label_share`: the share of it
  that comes from the label positions;
- `induction`, `previous_token`: attention scores on random token sequences repeated once
  (model_worker.analysis.atlas);
- `function_vector`: the function-vector *screen* (first order, not Todd et al.'s measure):
  each head's mean output at the last position, over the ICL prompts with the same label
  assignment (which class each label stands for), patched into prompts with shuffled labels;
  the change of LD = logit[true] − logit[false] by attribution patching, for every head. For
  the top `FV_EXACT` heads by the screen, Todd et al.'s *average indirect effect*, exact
  (`function_vector_aie`): the change in the correct answer's probability when that head alone
  is patched so, averaged over the prompts (and the exact LD change, `function_vector_exact`);
- `saliency`: Wang et al.'s label-word flow |A ⊙ ∂L/∂A| from the labels to the last token;
- `sink`: attention from the last position to position 0.

Correlations: Spearman's ρ between two scores over the heads (table `atlas_correlations`: the
estimates), with one 95% interval, from resampling the prompts, every score recomputed per
resample (`atlas_correlations_prompts`, model_worker.experiments.atlas_prompts: the interval the
page, the report and the verdicts all show). Verdicts ("in-context heads are X heads on this
model") from that interval: supported if its low end > 0, not supported if its high end < 0.3
(no more than a weak correlation), inconclusive otherwise.
"""

from __future__ import annotations

import random
from functools import partial
from itertools import combinations

import numpy as np
import torch
from torch import Tensor

from model_worker.analysis.atlas import (
    induction_scores,
    previous_token_scores,
    repeated_sequences,
    spearman,
    top_k,
)
from model_worker.contracts.common import head_name
from model_worker.contracts.experiments import ExperimentResult
from model_worker.datasets import IclPrompt, format_prompt
from model_worker.datasets.prompts import one_line
from model_worker.experiments import atlas_prompts, stats
from model_worker.experiments.batching import Batch, Prepared, PromptRun, each_prompt, run_prompts
from model_worker.experiments.context import Context, Row
from model_worker.experiments.data import class_of
from model_worker.experiments.evidence import Evidence, adequacy
from model_worker.experiments.figure_data import bar_chart, scatter
from model_worker.experiments.locate import n_located, zeroing
from model_worker.experiments.progress import ProgressFn, Stages
from model_worker.experiments.report import comparison, header, pct, table
from model_worker.experiments.slices import Record
from model_worker.model.capture import run_with_cache
from model_worker.patching.engine import (
    Activations,
    Patch,
    attribution,
    label_saliency,
    record,
    run_patched,
)

#: Prompts for the per-prompt passes (function vectors, saliency), random sequences, their half.
SUBSET = 16
SEQUENCES, HALF = 8, 24
FV_EXACT = 10
SCORES = (
    "in_context",
    "label_share",
    "induction",
    "previous_token",
    "function_vector",
    "saliency",
    "sink",
)
TYPES = {
    "in-context": "in_context",
    "function-vector": "function_vector",
    "induction": "induction",
    "previous-token": "previous_token",
}
ABLATIONS = [
    ("in-context", "function-vector"),
    ("function-vector", "in-context"),
    ("in-context", "induction"),
    ("induction", "in-context"),
]
WEAK = 0.3
PAPER = (
    "Yu & Ananiadou locate in-context heads by their direct effect; Todd et al. locate "
    "function-vector heads by their indirect effect; no paper puts them side by side"
)


#: a prompt's label assignment: (class, label) pairs, sorted
Assignment = tuple[tuple[str, str], ...]


def assignment(prompt: IclPrompt, classes: dict[str, str]) -> Assignment:
    """Which class each label stands for in `prompt` (its demonstrations and its query): prompts
    with the same assignment do the same task; the two assignments of a two-class dataset are
    opposite tasks, whose mean head outputs must not be averaged together."""
    found = {(classes.get(one_line(t), one_line(t)), label) for t, label in prompt.demonstrations}
    found.add((classes.get(one_line(prompt.input), one_line(prompt.input)), prompt.true_label))
    return tuple(sorted(found))


def mean_outputs(runs: list[PromptRun], classes: dict[str, str]) -> dict[Assignment, Tensor]:
    """Mean z at the last position [L, H·d] over the runs of each label assignment."""
    groups: dict[Assignment, list[Tensor]] = {}
    for r in runs:
        groups.setdefault(assignment(r.item.prompt, classes), []).append(r.extra[0])
    return {key: torch.stack(zs).mean(0) for key, zs in groups.items()}


def _sink(loaded_runs: list[PromptRun]) -> Tensor:
    """Mean sink attention [L, H] over the runs."""
    return torch.stack([r.extra[1] for r in loaded_runs]).mean(0)


def _within(stage: ProgressFn, i: int, n: int, fraction: float, message: str) -> None:
    """Progress of step `i` of `n` inside one stage."""
    stage((i + fraction) / n, message)


def shuffled(prompt: IclPrompt, rng: random.Random) -> IclPrompt:
    """`prompt` with its demonstrations' labels shuffled among them (Todd et al.)."""
    labels = [label for _, label in prompt.demonstrations]
    rng.shuffle(labels)
    demos = tuple(
        (text, label) for (text, _), label in zip(prompt.demonstrations, labels, strict=True)
    )
    return IclPrompt(
        text=format_prompt(demos, prompt.input),
        input=prompt.input,
        true_label=prompt.true_label,
        false_label=prompt.false_label,
        demonstrations=demos,
        variant=prompt.variant,
    )


#: how tables and figures name a score where its key does not say it
SCORE_LABELS = {"function_vector": "function-vector screen (first order, ΔLD)"}
#: the scores the in-context score is tested against, as the verdicts name them
VERSUS = {
    "function_vector": "function-vector (first-order screen)",
    "induction": "induction",
    "previous_token": "previous-token",
    "saliency": "saliency",
}


def _interval_of(row: Row) -> stats.Interval:
    """A prompt-bootstrap correlation row's interval (undefined bounds stay undefined)."""
    low, high, rho = row["low"], row["high"], row["spearman"]
    nan = float("nan")
    return stats.Interval(
        nan if rho is None else float(rho),
        nan if low is None else float(low),
        nan if high is None else float(high),
        int(row["prompts"] or 0),
        stats.PROMPT_BOOTSTRAP,
        undefined=None if row.get("undefined") is None else str(row["undefined"]),
    )


def run(ctx: Context) -> ExperimentResult:
    loaded, g = ctx.loaded, ctx.loaded.geometry
    n_heads = g.n_layers * g.n_heads
    stages = Stages(
        ctx.progress,
        {
            "scores": 1.0,
            "sequences": 0.2,
            "screen": 0.7,
            "function vectors": 0.5,
            "saliency": 0.5,
            "ablation": 2.0,
        },
    )
    items = ctx.prepare(ctx.prompts())

    def extra(batch: Batch, cache: object) -> list[tuple[Tensor, Tensor]]:
        out = []
        for row, item in enumerate(batch.items):
            last = item.last
            out.append(
                (
                    cache.z[:, row, last].cpu(),  # type: ignore[attr-defined]
                    cache.pattern[:, row, :, last, 0].cpu(),  # type: ignore[attr-defined]
                )
            )
        return out

    runs = run_prompts(
        loaded,
        items,
        batch_size=ctx.batch_size,
        increases="all",
        label_increases=True,
        extra=extra,
        progress=stages.stage("scores"),
        label="direct effects",
    )
    increase = torch.stack([r.increases for r in runs if r.increases is not None]).mean(0)
    label_increase = torch.stack(
        [r.label_increases for r in runs if r.label_increases is not None]
    ).mean(0)
    classes = class_of(ctx.dataset)
    mean_z, sink = mean_outputs(runs, classes), _sink(runs)
    share = torch.where(increase > 0, label_increase / increase.clamp(min=1e-12), torch.nan)

    stages.stage("sequences")(0.0, "random repeated sequences")
    generator = torch.Generator().manual_seed(ctx.seed)
    special = set(loaded.tokenizer.all_special_ids)
    vocabulary = [i for i in range(min(len(loaded.tokenizer), 50_000)) if i not in special]
    sequences = repeated_sequences(vocabulary, SEQUENCES, HALF, generator)
    with loaded.lock:
        cache = run_with_cache(loaded.model, loaded.adapter, g, sequences.to(loaded.device))
    induction = induction_scores(cache.pattern.cpu(), HALF)
    previous = previous_token_scores(cache.pattern[:, :, :, :HALF, :HALF].cpu())

    subset = items[:SUBSET]
    rng = random.Random(ctx.seed)
    fv_items = ctx.prepare([shuffled(item.prompt, rng) for item in subset])
    # each prompt's task's mean output (its label assignment's)
    task_zs = [mean_z[assignment(original.prompt, classes)] for original in subset]

    def fv_source(index: int, item: Prepared) -> Activations:
        """The prompt's activations with its task's mean z at the last position."""
        base = record(loaded, item.ids)
        sites = dict(base.sites)
        for layer in range(g.n_layers):
            z = sites[("z", layer)].clone()
            z[item.last] = task_zs[index][layer].to(z.device, z.dtype)
            sites[("z", layer)] = z
        return Activations(sites, base.logits)

    def fv_screen(index: int, item: Prepared) -> Record:
        found = attribution(loaded, item.ids, fv_source(index, item), item.true_id, item.false_id)
        return {"estimate": found.z[:, item.last].flatten().double().cpu()}

    # every per-prompt pass goes in slices (batching.each_prompt), as the batched ones do
    screened = each_prompt(
        fv_items, fv_screen, label="function-vector screen", progress=stages.stage("screen")
    )
    fv_estimates = [r["estimate"] for r in screened]
    function_vector = torch.stack(fv_estimates).mean(0)  # [L·H], the screen: LD change
    fv_top = top_k(function_vector.numpy(), min(FV_EXACT, n_heads))

    def fv_exact(index: int, item: Prepared) -> Record:
        rows: list[list[Patch]] = [[]]
        rows += [[Patch("z", h // g.n_heads, h % g.n_heads, (item.last,))] for h in fv_top]
        logits = run_patched(loaded, item.ids, fv_source(index, item), rows).logits
        ld = (logits[:, item.true_id] - logits[:, item.false_id]).double()
        p = torch.softmax(logits.double(), -1)[:, item.true_id]
        return {"ld": ld.cpu(), "p": p.cpu()}

    exact = each_prompt(
        fv_items,
        fv_exact,
        label="function vectors, exact",
        options=repr(list(fv_top)),
        progress=stages.stage("function vectors"),
    )
    exact_fv, aie = np.zeros(len(fv_top)), np.zeros(len(fv_top))
    for found in exact:
        ld, p = found["ld"].numpy(), found["p"].numpy()
        exact_fv += (ld[1:] - ld[0]) / len(fv_items)
        aie += (p[1:] - p[0]) / len(fv_items)

    def saliency_of(_index: int, item: Prepared) -> Record:
        return {
            "saliency": label_saliency(loaded, item.ids, item.true_id, item.label_positions).cpu()
        }

    salient = each_prompt(subset, saliency_of, label="saliency", progress=stages.stage("saliency"))
    saliencies = [r["saliency"] for r in salient]
    saliency = torch.stack(saliencies).mean(0)

    columns = {
        "in_context": increase.flatten(),
        "label_share": share.flatten(),
        "induction": induction.flatten(),
        "previous_token": previous.flatten(),
        "function_vector": function_vector.float(),
        "saliency": saliency.flatten(),
        "sink": sink.flatten(),
    }
    values = {name: columns[name].double().numpy() for name in SCORES}
    exact_of = dict(zip(fv_top, exact_fv.tolist(), strict=True))
    aie_of = dict(zip(fv_top, aie.tolist(), strict=True))
    rank_of = {
        name: np.argsort(np.argsort(-np.nan_to_num(v, nan=-np.inf))) for name, v in values.items()
    }
    head_rows: list[Row] = []
    for flat in range(n_heads):
        layer, head = divmod(flat, g.n_heads)
        row: Row = {"name": head_name(layer, head), "layer": layer, "head": head}
        for name in SCORES:
            value = float(values[name][flat])
            row[name] = None if np.isnan(value) else value
            row[f"{name}_rank"] = int(rank_of[name][flat]) + 1
        row["function_vector_exact"] = exact_of.get(flat)
        row["function_vector_aie"] = aie_of.get(flat)
        head_rows.append(row)

    evidence = Evidence(adequacy=adequacy(runs, ctx.request.design))
    correlations: list[Row] = []
    for a, b in combinations(SCORES, 2):
        keep = ~(np.isnan(values[a]) | np.isnan(values[b]))
        rho = float(spearman(np.stack([values[a][keep], values[b][keep]])))
        correlations.append(
            {
                "score_a": a,
                "score_b": b,
                "spearman": None if np.isnan(rho) else rho,
                "heads": int(keep.sum()),
            }
        )

    # the same correlations, resampling the prompts (every score recomputed per resample)
    full = [r for r in runs if r.increases is not None and r.label_increases is not None]
    draws = atlas_prompts.resampled_scores(
        {
            "in_context": np.stack([r.increases.flatten().double().numpy() for r in full]),  # type: ignore[union-attr]
            "label_increase": np.stack(
                [r.label_increases.flatten().double().numpy() for r in full]  # type: ignore[union-attr]
            ),
            "sink": np.stack([r.extra[1].flatten().double().numpy() for r in full]),
        },
        {
            "function_vector": torch.stack(fv_estimates).numpy(),
            "saliency": torch.stack(saliencies).flatten(1).double().numpy(),
        },
        {"induction": values["induction"], "previous_token": values["previous_token"]},
        seed=ctx.seed,
    )
    by_prompt = atlas_prompts.prompt_correlations(values, draws, SCORES, len(full))
    for row in by_prompt:  # one ρ, one interval: the prompts', wherever it is shown
        b = str(row["score_b"])
        if row["score_a"] != "in_context" or b not in VERSUS:
            continue
        evidence.decide(
            f"in-context heads are {VERSUS[b]} heads on this model (ρ > 0 over the heads)",
            f"spearman(in_context, {b})",
            _interval_of(row),
            min_effect=WEAK,
        )

    k = n_located(g.n_layers, g.n_heads)
    tops = {kind: top_k(np.nan_to_num(values[col], nan=-np.inf), k) for kind, col in TYPES.items()}
    plan: list[tuple[str, str, list[int]]] = [("none", "", [])]
    plan += [
        (zeroed, kept, [h for h in tops[zeroed] if h not in tops[kept]])
        for zeroed, kept in ABLATIONS
    ]
    ablation_stage = stages.stage("ablation")
    ablation_rows: list[Row] = []
    for i, (zeroed, kept, flat_heads) in enumerate(plan):
        heads = [divmod(h, g.n_heads) for h in flat_heads]
        done = run_prompts(
            loaded,
            items,
            batch_size=ctx.batch_size,
            intervene=zeroing(loaded, heads) if heads else None,
            progress=partial(_within, ablation_stage, i, len(plan)),
        )
        interval = stats.rate([r.correct for r in done])
        ablation_rows.append(
            {
                "zeroed": zeroed,
                "kept": kept or "—",
                "heads": " ".join(head_name(*h) for h in heads) or "—",
                "n_zeroed": len(heads),
                "accuracy": interval.estimate,
                "low": interval.low,
                "high": interval.high,
            }
        )

    fv_rho = next(
        r for r in by_prompt if r["score_b"] == "function_vector" and r["score_a"] == "in_context"
    )
    screen_vs_aie = float(spearman(np.stack([function_vector.numpy()[fv_top], aie])))
    metrics = {
        "heads": float(n_heads),
        "k": float(k),
        "spearman_in_context_function_vector": float(fv_rho["spearman"] or 0),
        "accuracy": float(ablation_rows[0]["accuracy"] or 0),
        "top_overlap_in_context_function_vector": float(
            len(set(tops["in-context"]) & set(tops["function-vector"]))
        ),
        # how far the first-order LD screen ranks the top heads as Todd et al.'s AIE does
        "spearman_fv_screen_aie_top": screen_vs_aie,
    }
    figures = {
        f"atlas_{b}": scatter(
            f"Per head: in-context increase vs {b.replace('_', ' ')}",
            {
                "heads": list(
                    zip(
                        values["in_context"].tolist(),
                        np.nan_to_num(values[b]).tolist(),
                        strict=True,
                    )
                )
            },
            xlabel="in-context (mean direct increase)",
            ylabel=SCORE_LABELS.get(b, b.replace("_", " ")),
        )
        for b in ("function_vector", "induction", "previous_token", "saliency")
    }
    figures["atlas_ablation"] = bar_chart(
        f"Accuracy with the top {k} heads of one type zeroed, another's kept (95% intervals)",
        [
            f"zero {r['zeroed']}, keep {r['kept']}" if r["kept"] != "—" else "none"
            for r in ablation_rows
        ],
        {"accuracy": [float(r["accuracy"] or 0) for r in ablation_rows]},
        ylabel="accuracy",
        low={"accuracy": [float(r["low"] or 0) for r in ablation_rows]},
        high={"accuracy": [float(r["high"] or 0) for r in ablation_rows]},
    )
    outcome = {v.quantity: v.outcome for v in evidence.verdicts}
    summary = (
        f"ρ(in-context, function-vector screen) = {_interval_of(fv_rho).text(digits=2)} "
        f"({outcome.get('spearman(in_context, function_vector)', '—')}); top-{k} overlap "
        f"{int(metrics['top_overlap_in_context_function_vector'])}; accuracy "
        f"{pct(metrics['accuracy'])}"
    )
    report = "\n".join(
        [
            header(ctx, "Head atlas — in-context heads beside the other head types"),
            f"Scores over {len(items)} prompts (function vectors and saliency over the first "
            f"{len(subset)}); induction and previous-token scores on {SEQUENCES} random "
            f"sequences of {HALF} tokens repeated once.\n",
            f"Summary: {summary}.\n",
            "`function_vector` is a first-order *screen* (the LD change by attribution "
            "patching, every head), not Todd et al.'s measure; their average indirect effect "
            "(exact: the change in the correct answer's probability, the head's mean output over "
            f"prompts of the same label assignment patched into shuffled-label prompts) is "
            f"`function_vector_aie`, for the top {len(fv_top)} heads by the screen; ρ(screen, "
            f"AIE) over those heads = {screen_vs_aie:+.2f}.\n",
            "## Function-vector heads: the screen and the exact average indirect effect\n",
            table(
                [
                    {
                        "head": head_name(*divmod(h, g.n_heads)),
                        "screen_ld": float(function_vector[h]),
                        "exact_ld": exact_of[h],
                        "aie_probability": aie_of[h],
                    }
                    for h in fv_top
                ]
            ),
            "",
            "## Spearman correlations over the heads (95% intervals: bootstrap over prompts, "
            "every score recomputed; induction and previous-token fixed: random sequences)\n",
            table(by_prompt),
            "",
            "## Ablation: top-k of one type zeroed, another's top-k kept\n",
            table(ablation_rows),
            "",
            comparison([("in-context heads vs function-vector heads", PAPER, summary)]),
        ]
    )
    tables = {
        "atlas": head_rows,
        "atlas_correlations": correlations,
        "atlas_correlations_prompts": by_prompt,
        "atlas_ablation": ablation_rows,
    }
    return ctx.result(metrics, tables, figures, report, evidence)
