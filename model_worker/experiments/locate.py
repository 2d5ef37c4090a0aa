"""Locating the in-context heads (the later paper version's recipe, made explicit).

1. Location prompts: min(n, 64) balanced prompts, both label assignments, seed + 1000 (disjoint
   in seed from the prompts an experiment evaluates on).
2. Head increase I(head | resid_pre) for the true label token at the last position, averaged
   over the correctly answered location prompts (all of them when none is correct), separately
   for prompts whose true label is "foo" and "bar".
3. Deep-layer heads only (layer ≥ L // 2). For each label, the `k/2 + 2` deep heads with the
   largest mean increase are candidates; each candidate is zeroed alone and the accuracy on that
   label's location prompts re-measured (drop = base − zeroed; ties broken by the drop of the
   mean true − false logit margin).
4. Combined score = rank by increase + rank by drop among the label's candidates; the `k/2`
   best per label (ties → larger increase) are the in-context heads: half pushing "foo", half
   "bar". k = 2·⌈0.5% of all heads⌉ (≥ 2): 12 of 1,024 for Llama-7B, 4 of 270 for SmolLM2.

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

from model_worker.contracts import RankBy, head_name
from model_worker.datasets import LABELS, IclPrompt
from model_worker.defaults import DEFAULT_MAX_PROMPT_TOKENS
from model_worker.experiments.batching import Intervene, PromptRun, accuracy, prepare, run_prompts
from model_worker.experiments.context import Context
from model_worker.experiments.data import location_prompts
from model_worker.experiments.progress import ProgressFn, Stages, no_progress
from model_worker.interventions import Head, zero_heads
from model_worker.loading import LoadedModel


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


def margin(runs: Sequence[PromptRun]) -> float:
    """Mean true − false label logit."""
    return sum(r.true_logit - r.false_logit for r in runs) / len(runs) if runs else 0.0


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
    for label in LABELS:
        label_correct = _label_runs(correct, label) or correct
        scores = mean_increase(label_correct, label=by == "label")
        plan.append((label, _label_runs(runs, label) or list(runs), scores, ranked(scores, deep)))
    total = sum(min(n_candidates, len(order)) for *_, order in plan)
    ablate, done = stages.stage("ablate"), 0
    chosen: list[Head] = []
    rows: list[dict[str, float | int | str | None]] = []
    for label, label_runs, scores, order in plan:
        subset = [r.item for r in label_runs]
        base_acc, base_margin = accuracy(label_runs), margin(label_runs)
        found = []
        for rank, head in enumerate(order[:n_candidates]):
            zeroed = run_prompts(
                loaded, subset, batch_size=batch_size, intervene=zeroing(loaded, [head])
            )
            done += 1
            ablate(done / total, f"zeroing candidate {head_name(*head)} ({done}/{total})")
            found.append((head, rank, base_acc - accuracy(zeroed), base_margin - margin(zeroed)))
        by_drop = sorted(found, key=lambda f: (-f[2], -f[3]))
        drop_rank = {f[0]: i for i, f in enumerate(by_drop)}
        combined = sorted(found, key=lambda f: (f[1] + drop_rank[f[0]], f[1]))
        picked = [f[0] for f in combined if f[0] not in chosen][:per_label]
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
                "accuracy_drop": acc_drop,
                "margin_drop": margin_drop,
                "drop_rank": drop_rank[head] + 1,
                "located": "yes" if head in picked else "no",
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
    )


_LOCATIONS: weakref.WeakKeyDictionary[Any, dict[tuple[str, int, int, int, str], Location]] = (
    weakref.WeakKeyDictionary()
)
MAX_REMEMBERED = 8


def locate_for(ctx: Context, progress: ProgressFn) -> Location:
    """The in-context heads of the experiment's model, located on its dataset's location set.

    Remembered per (model, dataset, location-set size, seed) for this process, so experiments
    run one after another on the same model and dataset share one location.
    """
    prompts = location_prompts(ctx.dataset, ctx.n, ctx.seed)
    remembered = _LOCATIONS.setdefault(ctx.loaded.model, {})
    by = ctx.request.locate_by
    key = (ctx.dataset.name, hash(ctx.dataset.examples), len(prompts), ctx.seed, by)
    if key not in remembered:
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
        remembered[key] = location
    progress(1.0, "in-context heads located")
    return remembered[key]


def share_text(share: float | None) -> str:
    """A label share as a percentage (— when the head's mean increase is not positive)."""
    return "—" if share is None else f"{100 * share:.0f}%"


def location_note(location: Location) -> str:
    """One Markdown paragraph saying which heads were located, how, and their label shares."""
    ranked = "label increase" if location.by == "label" else "head increase"
    shares = ", ".join(
        f"{head_name(*h)} {share_text(location.label_share(h))}" for h in location.heads
    )
    return (
        f"In-context heads located (recipe in `model_worker/experiments/locate.py`: deep-layer "
        f"heads ranked by mean {ranked} and by the accuracy drop when zeroed alone, on "
        f"{location.n_prompts} location prompts, {location.n_correct} correct): "
        f"**{', '.join(location.names)}**. Label share (mean label increase / mean increase, "
        f"the part of a head's increase that its label positions alone give): {shares}.\n"
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
