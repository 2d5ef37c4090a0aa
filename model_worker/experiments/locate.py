"""Locating the in-context heads (the later paper version's recipe, made explicit).

1. Location prompts: min(n, 64) balanced prompts, both label assignments, seed + 1000 (disjoint
   in seed from the prompts an experiment evaluates on).
2. Head increase I(head | resid_pre) for the true label token at the last position, averaged
   over the correctly answered location prompts (all of them when none is correct), separately
   for prompts whose true label is "foo" and "bar".
3. Deep-layer heads only (layer ≥ L // 2). For each label, the `k/2 + 2` deep heads with the
   largest mean increase are candidates; each candidate is zeroed alone and the accuracy on that
   label's location prompts re-measured: drop = base − zeroed, with its paired-bootstrap 95%
   interval over those prompts (and the drop of the mean true − false logit margin, reported).
4. Drop criterion: a candidate passes when its drop's interval lies above 0. Per label, the
   passing candidates with the largest increase, at most `k/2`, are the in-context heads. Ties
   are never broken by noise: when no candidate of a label passes, the report says "no head
   passes the drop criterion" for it, and its `k/2` slots go to the candidates with the largest
   increase alone, marked `located = "by increase only"` (so the head-level experiments still
   have heads to study, and say how they were chosen). k = 2·⌈0.5% of all heads⌉ (≥ 2): 12 of
   1,024 for Llama-7B, 4 of 270 for SmolLM2.

With `by="label"` steps 2–4 use the *label increase* instead (the head restricted to its label
positions), which locates heads that read the labels. Either way every head's label share
(mean label increase / mean increase, over the same prompts) is reported.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from model_worker.common.defaults import DEFAULT_MAX_PROMPT_TOKENS
from model_worker.contracts.common import RankBy, head_name
from model_worker.datasets import IclPrompt
from model_worker.experiments import stats
from model_worker.experiments.batching import Intervene, PromptRun, accuracy, prepare, run_prompts
from model_worker.experiments.context import Context
from model_worker.experiments.data import location_prompts
from model_worker.experiments.evidence import interval_columns
from model_worker.experiments.progress import ProgressFn, Stages, no_progress
from model_worker.experiments.slices import current_slicer
from model_worker.model.interventions import Head, zero_heads
from model_worker.model.loading import LoadedModel


def n_located(n_layers: int, n_heads: int) -> int:
    """2·⌈0.005 · L·H⌉, at least 2: about 1% of the heads, an even number (half per label)."""
    return max(2, 2 * math.ceil(0.005 * n_layers * n_heads))


def mean_increase(runs: Sequence[PromptRun], label: bool = False) -> Tensor:
    """[L, H] mean head increase (`label`: label increase) over the runs that have one
    (correct ones when computed so)."""
    found = [r.label_increases if label else r.increases for r in runs]
    tables = [t for t in found if t is not None]
    if not tables:
        raise ValueError("no prompt has head increases")
    return torch.stack(tables).mean(0)


def ranked(scores: Tensor, among: Sequence[Head] | None = None) -> list[Head]:
    """Heads by descending `scores` [L, H], restricted to `among` if given."""
    n_heads = scores.shape[1]
    flat = scores.flatten().argsort(descending=True).tolist()
    order = [(f // n_heads, f % n_heads) for f in flat]
    if among is None:
        return order
    allowed = set(among)
    return [h for h in order if h in allowed]


def zeroing(loaded: LoadedModel, heads: Sequence[Head]) -> Intervene:
    """An `intervene` argument for run_prompts that zeroes `heads` in every batch."""
    return lambda _batch: zero_heads(loaded, heads)


def label_share(total: Tensor, label: Tensor, head: Head) -> float | None:
    """label[head] / total[head] of two [L, H] tables, None unless total[head] > 0."""
    whole = float(total[head])
    return float(label[head]) / whole if whole > 0 else None


@dataclass(frozen=True)
class Location:
    """The located in-context heads, the increase ranking, and the candidates' bookkeeping."""

    heads: list[Head]
    mean_increase: Tensor
    candidates: list[dict[str, float | int | str | None]]
    n_prompts: int
    n_correct: int
    accuracy: float
    mean_label_increase: Tensor
    by: RankBy = "increase"
    #: the labels for which no candidate passed the drop criterion
    refused: tuple[str, ...] = ()

    @property
    def names(self) -> list[str]:
        return [head_name(*h) for h in self.heads]

    def label_share(self, head: Head) -> float | None:
        """Mean label increase / mean increase of `head` (None unless the increase is > 0)."""
        return label_share(self.mean_increase, self.mean_label_increase, head)

    def top(self, k: int) -> list[Head]:
        """The k heads with the largest mean increase (any layer)."""
        return ranked(self.mean_increase)[:k]


def _label_runs(runs: Sequence[PromptRun], label: str) -> list[PromptRun]:
    return [r for r in runs if r.item.prompt.true_label == label]


def locate_heads(
    loaded: LoadedModel,
    prompts: Sequence[IclPrompt],
    *,
    batch_size: int = 16,
    progress: ProgressFn = no_progress,
    by: RankBy = "increase",
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
) -> Location:
    """Locate the in-context heads on `prompts` (see the module docstring; a prompt longer
    than `max_tokens` is a PromptError)."""
    g = loaded.geometry
    k = n_located(g.n_layers, g.n_heads)
    per_label = k // 2
    n_candidates = per_label + 2
    stages = Stages(progress, {"increase": 1.0, "ablate": 1.0})
    items = prepare(loaded, prompts, max_tokens)
    runs = run_prompts(
        loaded,
        items,
        batch_size=batch_size,
        increases="all",
        label_increases=True,
        progress=stages.stage("increase"),
        label="head increases",
    )
    correct = [r for r in runs if r.correct] or list(runs)
    totals, label_totals = mean_increase(correct), mean_increase(correct, label=True)
    deep = [(layer, h) for layer in range(g.n_layers // 2, g.n_layers) for h in range(g.n_heads)]
    plan: list[tuple[str, list[PromptRun], Tensor, list[Head]]] = []
    for label in dict.fromkeys(r.item.prompt.true_label for r in runs):  # foo, bar or classes
        label_correct = _label_runs(correct, label) or correct
        scores = mean_increase(label_correct, label=by == "label")
        plan.append((label, _label_runs(runs, label) or list(runs), scores, ranked(scores, deep)))
    total = sum(min(n_candidates, len(order)) for *_, order in plan)
    ablate, done = stages.stage("ablate"), 0
    chosen: list[Head] = []
    refused: list[str] = []
    rows: list[dict[str, float | int | str | None]] = []
    for label, label_runs, scores, order in plan:
        subset = [r.item for r in label_runs]
        base_correct = [float(r.correct) for r in label_runs]
        base_margins = [r.true_logit - r.false_logit for r in label_runs]
        found = []
        for rank, head in enumerate(order[:n_candidates]):
            zeroed = run_prompts(
                loaded, subset, batch_size=batch_size, intervene=zeroing(loaded, [head])
            )
            done += 1
            ablate(done / total, f"zeroing candidate {head_name(*head)} ({done}/{total})")
            acc_drop = stats.bootstrap_diff(
                base_correct, [float(r.correct) for r in zeroed], paired=True
            )
            margin_drop = stats.bootstrap_diff(
                base_margins, [r.true_logit - r.false_logit for r in zeroed], paired=True
            )
            found.append((head, rank, acc_drop, margin_drop))
        passing = [f[0] for f in found if f[2].low > 0 and f[0] not in chosen]
        if passing:
            picked, how = passing[:per_label], "yes"
        else:
            refused.append(label)
            picked = [f[0] for f in found if f[0] not in chosen][:per_label]
            how = "by increase only"
        chosen += picked
        rows += [
            {
                "label": label,
                "head": head_name(*head),
                "layer": head[0],
                "mean_increase": float(scores[head]),
                "increase_rank": rank + 1,
                "ranked_by": by,
                "label_share": label_share(totals, label_totals, head),
                **interval_columns("accuracy_drop", acc_drop),
                "passes_drop_criterion": "yes" if acc_drop.low > 0 else "no",
                **interval_columns("margin_drop", margin_drop),
                "located": how if head in picked else "no",
            }
            for head, rank, acc_drop, margin_drop in found
        ]
    return Location(
        heads=chosen,
        mean_increase=totals,
        candidates=rows,
        n_prompts=len(runs),
        n_correct=sum(r.correct for r in runs),
        accuracy=accuracy(runs),
        mean_label_increase=label_totals,
        by=by,
        refused=tuple(refused),
    )


#: per model: each location remembered, and how many passes locating it took
_LOCATIONS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], tuple[Location, int]]] = (
    weakref.WeakKeyDictionary()
)
MAX_REMEMBERED = 8


def locate_for(ctx: Context, progress: ProgressFn) -> Location:
    """The in-context heads of the experiment's model, located on its dataset's location set.

    Remembered per (model, dataset, location-set size, seed) for this process, so experiments
    run one after another on the same model and dataset share one location.
    """
    options = ctx.prompt_options
    prompts = location_prompts(ctx.dataset, ctx.n, ctx.seed, **options)
    remembered = _LOCATIONS.setdefault(ctx.loaded.model, {})
    by = ctx.request.locate_by
    design = tuple(options.values())
    key = (ctx.dataset.name, hash(ctx.dataset.examples), len(prompts), ctx.seed, by, design)
    slicer = current_slicer()
    if key not in remembered:
        before = slicer.passes
        location = locate_heads(
            ctx.loaded,
            prompts,
            batch_size=ctx.batch_size,
            progress=progress,
            by=by,
            max_tokens=ctx.max_tokens,
        )
        while len(remembered) >= MAX_REMEMBERED:
            remembered.pop(next(iter(remembered)))
        remembered[key] = (location, slicer.passes - before)
    else:  # its passes count as run: every replay of a chunked experiment numbers them alike
        slicer.skipped(remembered[key][1])
    progress(1.0, "in-context heads located")
    return remembered[key][0]


def share_text(share: float | None) -> str:
    """A label share as a percentage (— when the head's mean increase is not positive)."""
    return "—" if share is None else f"{100 * share:.0f}%"


def location_note(location: Location) -> str:
    """One Markdown paragraph saying which heads pass the rule (or that none does), which heads
    the experiment studies instead, how they were chosen, and their label shares."""
    ranked = "label increase" if location.by == "label" else "head increase"
    shares = ", ".join(
        f"{head_name(*h)} {share_text(location.label_share(h))}" for h in location.heads
    )

    def drop(r: dict[str, float | int | str | None]) -> str:
        low, high = r["accuracy_drop_low"], r["accuracy_drop_high"]
        bounds = (
            "undefined"
            if low is None or high is None or math.isnan(float(low)) or math.isnan(float(high))
            else f"{float(low):+.3f}, {float(high):+.3f}"
        )
        return f"{r['head']} {float(r['accuracy_drop'] or 0):+.3f} [{bounds}]"

    chosen = [r for r in location.candidates if r["located"] != "no"]
    passing = [str(r["head"]) for r in chosen if r["located"] == "yes"]
    instead = [str(r["head"]) for r in chosen if r["located"] != "yes"]
    found = (
        f"heads that pass it: **{', '.join(passing)}**"
        if passing
        else "**no head passes the drop criterion**"
    )
    refusal = "".join(
        f" No head passes the drop criterion for `{label}`." for label in location.refused
    )
    studied = (
        f" Studied instead (the candidates with the largest increase alone; they fail the "
        f"rule, so they are not located heads): {', '.join(instead)}."
        if instead
        else ""
    )
    return (
        f"In-context heads (recipe in `model_worker/experiments/locate.py`: deep-layer "
        f"candidates ranked by mean {ranked}, located when zeroing one alone drops accuracy on "
        f"its label's prompts, the drop's 95% interval above 0; {location.n_prompts} location "
        f"prompts, {location.n_correct} correct): {found}.{refusal}{studied} "
        f"Accuracy drop when zeroed alone [95% interval]: {', '.join(drop(r) for r in chosen)}. "
        f"Label share (mean label increase / mean increase, the part of a head's increase that "
        f"its label positions alone give): {shares}.\n"
    )


def evaluated(ctx: Context, runs: list[PromptRun]) -> tuple[list[PromptRun], str]:
    """The runs an experiment measures (only the correctly answered ones with the request's
    `correct_only`, all of them when none is) and a phrase saying which."""
    if not ctx.request.correct_only:
        return runs, "all prompts"
    correct = [r for r in runs if r.correct]
    if not correct:
        return runs, "all prompts: none was answered correctly"
    return correct, f"correctly answered only: {len(correct)} of {len(runs)}"
