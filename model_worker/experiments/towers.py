"""Experiment `towers`: where the located in-context heads' preference for the true label comes
from, over the dataset (docs/towers.md; the decomposition is model_worker.analysis.qk_attribution).

Per prompt and located head, at the last position t: p = the true label position the head
attends to most, q = the false one it attends to most. Measured:
- key side at p and query side at t: each upstream component's share of the side,
  |⟨q, k_c⟩| / Σ_c |⟨q, k_c⟩| (query side: |⟨q_c, k⟩| / Σ); mean over prompts, bootstrap 95% CI;
- the difference Δ = score(t, p) − score(t, q) split by the key-side token slots it comes from:
  the label tokens themselves (slots p and q), their demonstrations' input tokens (the tokens
  after the previous label up to the label, separator included), every other token and the
  biases; and, on the other axis, its rotary position part. Each as a share of Δ: the ratio of
  the means over prompts (bootstrap over prompts);
- recurrence: how often the head's most frequent top key-side component is its top one
  (exact binomial interval).

Hypothesis 1: Δ comes from content (the tokens' features), not rotary position — quantity:
1 − position part / Δ, supported when its interval lies above 0.5. Hypothesis 2: the label token
itself carries more of Δ than its demonstration's input tokens — quantity: (label − input) / Δ,
null 0. Both verdicts come from the intervals (model_worker.experiments.stats).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from model_worker.analysis.qk_attribution import Attribution
from model_worker.contracts.common import head_name
from model_worker.contracts.experiments import ExperimentResult
from model_worker.experiments import stats
from model_worker.experiments.batching import Prepared, each_prompt
from model_worker.experiments.context import Context, Row
from model_worker.experiments.evidence import Evidence, adequacy_of
from model_worker.experiments.figure_data import bar_chart
from model_worker.experiments.locate import locate_for, location_note
from model_worker.experiments.progress import Stages
from model_worker.experiments.report import comparison, header, table
from model_worker.experiments.slices import Record
from model_worker.model.capture import run_with_cache
from model_worker.model.interventions import Head
from model_worker.towers.run import decompose

#: the parts of Δ by key-side token slot (they sum to Δ), then the position axis
GROUPS = ("label", "input", "other")
TOP = 5  # components listed per head and side


@dataclass(frozen=True)
class PromptTowers:
    """One prompt and head: component shares of each side at the true label, and Δ's parts."""

    names: tuple[str, ...]
    key_shares: np.ndarray
    query_shares: np.ndarray
    delta: float
    parts: dict[str, float]  # GROUPS and "position"


def shares(values: torch.Tensor) -> np.ndarray:
    """|values| / Σ |values| (zeros for an all-zero side)."""
    magnitude = values.abs()
    total = float(magnitude.sum())
    return (magnitude / total if total else magnitude).double().cpu().numpy()


def input_span(item: Prepared, position: int) -> list[int]:
    """The token positions of the demonstration input of the label at `position`: after the
    previous label (or from the start) up to the label, separator included."""
    earlier = [p for p in item.label_positions if p < position]
    start = earlier[-1] + 1 if earlier else 0
    return list(range(start, position))


def measure(
    item: Prepared, at_true: Attribution, diff: Attribution, p: int, q: int
) -> PromptTowers:
    """The shares at p and Δ's parts from the difference decomposition `diff` (p minus q)."""
    slots = diff.key_split.sum(0)  # [S + 1]: Δ by key-side token slot
    label = float(slots[p] + slots[q])
    inputs = float(slots[input_span(item, p) + input_span(item, q)].sum())
    delta = float(diff.score)
    position = float((diff.terms - diff.content_terms).sum())
    return PromptTowers(
        names=at_true.names,
        key_shares=shares(at_true.by_key),
        query_shares=shares(at_true.by_query),
        delta=delta,
        parts={
            "label": label,
            "input": inputs,
            "other": delta - label - inputs,
            "position": position,
        },
    )


def to_record(measured: PromptTowers) -> Record:
    """What a slice keeps of one prompt and head (numbers, tensors and names only)."""
    return {
        "names": list(measured.names),
        "key_shares": torch.from_numpy(measured.key_shares),
        "query_shares": torch.from_numpy(measured.query_shares),
        "delta": measured.delta,
        "parts": dict(measured.parts),
    }


def from_record(record: Record) -> PromptTowers:
    """The PromptTowers a slice kept (`to_record`)."""
    return PromptTowers(
        names=tuple(record["names"]),
        key_shares=record["key_shares"].numpy(),
        query_shares=record["query_shares"].numpy(),
        delta=float(record["delta"]),
        parts={name: float(value) for name, value in record["parts"].items()},
    )


def ratio_of_means(numerator: Sequence[float], denominator: Sequence[float]) -> stats.Interval:
    """mean(numerator) / mean(denominator) over prompts, bootstrap interval (paired)."""

    def statistic(data: np.ndarray) -> np.ndarray:
        below = data[..., 1, :].mean(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(below != 0, data[..., 0, :].mean(-1) / below, np.nan)

    return stats.bootstrap_stat([list(numerator), list(denominator)], statistic)


def run(ctx: Context) -> ExperimentResult:
    stages = Stages(ctx.progress, {"locate": 2.0, "decompose": 1.0})
    location = locate_for(ctx, stages.stage("locate"))
    loaded, g = ctx.loaded, ctx.loaded.geometry
    items = ctx.prepare(ctx.prompts())

    def towers_of(_index: int, item: Prepared) -> Record:
        """One prompt: is it answered right, and each located head's measures (None where
        the prompt lacks a true or a false label)."""
        with loaded.lock:
            cache = run_with_cache(
                loaded.model,
                loaded.adapter,
                g,
                item.ids[None].to(loaded.device),
                logits_to_keep=1,
                record_qk=True,
            )
        last_logits = cache.logits[0, -1]
        true = [p for p, t in zip(item.label_positions, item.label_true, strict=True) if t]
        false = [p for p, t in zip(item.label_positions, item.label_true, strict=True) if not t]
        heads: list[Record | None] = []
        for layer, index in location.heads:
            if not (true and false):
                heads.append(None)
                continue
            row = cache.pattern[layer, 0, index, item.last]
            p = max(true, key=lambda x: float(row[x]))
            q = max(false, key=lambda x: float(row[x]))
            at_p, at_q = decompose(loaded, cache, layer, index, item.last, [p, q])
            heads.append(to_record(measure(item, at_p, at_p.minus(at_q), p, q)))
        return {
            "correct": bool(last_logits[item.true_id] > last_logits[item.false_id]),
            "heads": heads,
        }

    # in slices (batching.each_prompt): interactive jobs and cancels between two prompts
    records = each_prompt(
        items,
        towers_of,
        label="decomposed",
        options=repr(location.heads),
        progress=stages.stage("decompose"),
    )
    correct = [bool(r["correct"]) for r in records]
    found: dict[Head, list[PromptTowers]] = {
        head: [from_record(r["heads"][i]) for r in records if r["heads"][i] is not None]
        for i, head in enumerate(location.heads)
    }

    evidence = Evidence(adequacy=adequacy_of(correct, ctx.request.design))
    component_rows: list[Row] = []
    recurrence_rows: list[Row] = []
    parts: dict[str, list[float]] = {name: [] for name in (*GROUPS, "position")}
    deltas: list[float] = []
    for head, runs in found.items():
        if not runs:
            continue
        names = runs[0].names
        for side in ("key", "query"):
            matrix = np.stack([getattr(r, f"{side}_shares") for r in runs])  # [n, N]
            intervals = stats.bootstrap_means(matrix)
            order = np.argsort(-matrix.mean(0))[:TOP]
            for rank, c in enumerate(order.tolist(), start=1):
                component_rows.append(
                    {
                        "head": head_name(*head),
                        "side": side,
                        "rank": rank,
                        "component": names[c],
                        "share": intervals[c].estimate,
                        "share_low": intervals[c].low,
                        "share_high": intervals[c].high,
                    }
                )
        tops = [names[int(np.argmax(r.key_shares))] for r in runs]
        common, _ = Counter(tops).most_common(1)[0]
        recurrence = stats.rate([t == common for t in tops])
        recurrence_rows.append(
            {
                "head": head_name(*head),
                "top_key_component": common,
                "recurrence": recurrence.estimate,
                "recurrence_low": recurrence.low,
                "recurrence_high": recurrence.high,
                "n": recurrence.n,
            }
        )
        for r in runs:
            deltas.append(r.delta)
            for name in parts:
                parts[name].append(r.parts[name])

    share_rows: list[Row] = []
    shares_of: dict[str, stats.Interval] = {}
    for name in (*GROUPS, "position"):
        shares_of[name] = evidence.add(f"delta_share_{name}", ratio_of_means(parts[name], deltas))
        share_rows.append({"part": name, **_interval_row(shares_of[name])})
    delta = evidence.add("delta", stats.bootstrap_mean(deltas))
    content = evidence.decide(
        "the located heads' true-vs-false score difference comes from the tokens' features, "
        "not from rotary position",
        "content share of Δ",
        ratio_of_means([d - p for d, p in zip(deltas, parts["position"], strict=True)], deltas),
        null=0.5,
    )
    label_over_input = evidence.decide(
        "the label token itself carries more of Δ than its demonstration's input tokens",
        "(label − input) share of Δ",
        ratio_of_means(
            [a - b for a, b in zip(parts["label"], parts["input"], strict=True)], deltas
        ),
    )
    metrics = {
        "delta": delta.estimate,
        **{f"delta_share_{k}": v.estimate for k, v in shares_of.items()},
        "content_share": content.interval.estimate,
    }
    figures = {
        "delta_parts": bar_chart(
            f"Where Δ = score(true label) − score(false label) comes from — "
            f"{ctx.dataset.name} ({len(deltas)} prompt × head pairs)",
            list(shares_of),
            {"share of Δ": [v.estimate for v in shares_of.values()]},
            ylabel="share of Δ (ratio of means)",
            low={"share of Δ": [v.low for v in shares_of.values()]},
            high={"share of Δ": [v.high for v in shares_of.values()]},
        )
    }
    report = "\n".join(
        [
            header(ctx, "Towers — why the in-context heads prefer the true label"),
            location_note(location),
            "",
            "Per prompt and located head: p = the most attended true label, q = the most "
            "attended false label; Δ = score(t, p) − score(t, q) decomposed exactly "
            "(docs/towers.md). Shares of Δ are ratios of means over prompt × head pairs with "
            "bootstrap 95% intervals; label + input + other = 1; position is the rotary part "
            "(another axis).\n",
            f"Mean Δ: {delta.text()}. Content share: {content.interval.text()} "
            f"({content.outcome}); (label − input) share: {label_over_input.interval.text()} "
            f"({label_over_input.outcome}).\n",
            "## Shares of Δ\n",
            table(share_rows),
            "",
            "## Upstream components carrying each side (at the true label)\n",
            table(component_rows),
            "",
            "## Recurrence of the top key-side component across prompts\n",
            table(recurrence_rows),
            "",
            comparison(
                [
                    (
                        "what makes an in-context head attend to the true label",
                        "the query and key matrices are two towers: a similarity between the "
                        "input text's features (last position) and each demonstration's "
                        "features gathered at its label",
                        f"Δ's shares — label token {shares_of['label'].text()}, demonstration "
                        f"input {shares_of['input'].text()}, other tokens "
                        f"{shares_of['other'].text()}; rotary position part "
                        f"{shares_of['position'].text()}",
                    )
                ]
            ),
        ]
    )
    tables = {
        "delta_parts": share_rows,
        "components": component_rows,
        "recurrence": recurrence_rows,
    }
    return ctx.result(metrics, tables, figures, report, evidence)


def _interval_row(interval: stats.Interval) -> Row:
    return {"share": interval.estimate, "share_low": interval.low, "share_high": interval.high}
