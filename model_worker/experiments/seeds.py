"""One experiment run with several seeds, combined into one result (torch-free).

Seeds are more prompts. The combined result is the first seed's (metrics, tables, figures,
report), plus: `seeds`; `seed_spread` (each metric, and each interval's estimate, across the
seeds: mean, sample SD, min, max); the table `verdicts_by_seed` (every verdict of every seed);
every interval, the adequacy gate and every verdict pooled under `COMBINED_RULE`: the interval
recomputed over all prompts of all seeds (`stats.pool`), the verdict decided from it, each
seed's own verdict kept beside it as a stability check. An interval whose prompts' values a
seed did not keep stays the first seed's (its `seeds` empty); a verdict on one is undecided.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from model_worker.contracts.evidence import AdequacyOut, IntervalOut, SpreadOut, VerdictOut
from model_worker.contracts.experiments import ExperimentResult
from model_worker.experiments import stats
from model_worker.experiments.evidence import (
    ADEQUACY,
    adequacy_from,
    adequacy_out,
    interval_out,
)

COMBINED_RULE = (
    "pooled over seeds: decided from the 95% interval over all prompts of all seeds (the "
    "seeds' prompts joined and the interval recomputed); each seed's own verdict is shown "
    "beside it as a stability check, not as a vote. The rule: "
)
#: the rule results stored before seeds were pooled were combined under
VOTE_RULE = "combined over seeds: supported (not supported) when every seed's verdict is"

#: per seed: every interval the run computed, with its sample (stats.Interval.sample)
Kept = Mapping[str, stats.Interval]


def spread_of(results: Sequence[ExperimentResult]) -> dict[str, SpreadOut]:
    """Each metric and interval estimate present in every result, across the results."""
    values: dict[str, list[float]] = {}
    for result in results:
        found = dict(result.metrics)
        for name, interval in result.intervals.items():
            if interval.estimate is not None:
                found.setdefault(name, interval.estimate)
        for name, value in found.items():
            values.setdefault(name, []).append(value)
    out = {}
    for name, seen in sorted(values.items()):
        if len(seen) == len(results):
            spread = stats.seed_spread(seen)
            out[name] = SpreadOut(
                mean=spread.mean,
                sd=spread.sd,
                min=spread.low,
                max=spread.high,
                values=list(spread.values),
            )
    return out


def pooled_interval(name: str, kept: Sequence[Kept]) -> stats.Interval | None:
    """`name`'s interval over the prompts of every seed that computed it, or None when a seed
    computed it without keeping its prompts' values (or none computed it)."""
    found = [k[name] for k in kept if name in k]
    if not found or any(i.sample is None for i in found):
        return None
    return stats.pool(found)


def pooled_verdicts(
    first: Sequence[VerdictOut], kept: Sequence[Kept], seeds: Sequence[int]
) -> list[VerdictOut]:
    """The first seed's verdicts, each decided again from its pooled interval (COMBINED_RULE);
    undecided (inconclusive, the interval undefined) where it cannot be pooled."""
    out = []
    for verdict in first:
        pooled = pooled_interval(verdict.quantity, kept)
        if pooled is None:
            interval = IntervalOut(
                estimate=None,
                low=None,
                high=None,
                n=0,
                method=verdict.interval.method,
                undefined="a seed kept no per-prompt values to pool",
            )
            outcome: stats.Outcome = "inconclusive"
        else:
            interval = interval_out(pooled, seeds)
            outcome = stats.decide(pooled, null=verdict.null, min_effect=verdict.min_effect)
        out.append(
            verdict.model_copy(
                update={
                    "interval": interval,
                    "outcome": outcome,
                    "rule": COMBINED_RULE + verdict.rule,
                }
            )
        )
    return out


def pooled_adequacy(
    first: AdequacyOut | None, kept: Sequence[Kept], seeds: Sequence[int]
) -> AdequacyOut | None:
    """The gate decided from the accuracy over all seeds' prompts (the first seed's when a
    seed kept none)."""
    pooled = pooled_interval(ADEQUACY, kept)
    if first is None or pooled is None:
        return first
    return adequacy_out(adequacy_from(pooled, first.design), seeds)


def combine_seeds(
    results: Sequence[ExperimentResult], kept: Sequence[Kept] | None = None
) -> ExperimentResult:
    """The results of one experiment under several seeds, as one result (module docstring);
    `kept`: per result, its intervals with their samples (without them nothing can be pooled:
    every verdict is then undecided)."""
    if not results:
        raise ValueError("no results to combine")
    if len({(r.name, r.dataset, r.model, r.n, r.design) for r in results}) != 1:
        raise ValueError("results to combine must differ in their seed only")
    kept = list(kept) if kept is not None else [{} for _ in results]
    if len(kept) != len(results):
        raise ValueError("one set of kept intervals per result")
    seeds = [r.seed for r in results]
    rows: list[dict[str, float | int | str | None]] = [
        {
            "quantity": v.quantity,
            "seed": r.seed,
            "estimate": v.interval.estimate,
            "low": v.interval.low,
            "high": v.interval.high,
            "outcome": v.outcome,
        }
        for r in results
        for v in r.verdicts
    ]
    first = results[0]
    intervals = dict(first.intervals)
    for name in intervals:
        pooled = pooled_interval(name, kept)
        if pooled is not None:
            intervals[name] = interval_out(pooled, seeds)
    return first.model_copy(
        update={
            "seeds": seeds,
            "seed_spread": spread_of(results),
            "intervals": intervals,
            "adequacy": pooled_adequacy(first.adequacy, kept, seeds),
            "verdicts": pooled_verdicts(first.verdicts, kept, seeds),
            "tables": {**first.tables, "verdicts_by_seed": rows},
        }
    )


#: most seeds one command runs
MAX_SEEDS = 20


def parse_seeds(text: str) -> list[int]:
    """`0,1,2` → [0, 1, 2] (duplicates dropped); ValueError for anything else or more than
    MAX_SEEDS seeds."""
    parts = [part.strip() for part in text.split(",")]
    if not all(p.isascii() and p.lstrip("-").isdigit() and len(p) < 10 for p in parts):
        raise ValueError(f"--seeds must be integers separated by commas, got {text[:40]!r}")
    found = list(dict.fromkeys(int(p) for p in parts))
    if len(found) > MAX_SEEDS:
        raise ValueError(f"--seeds: at most {MAX_SEEDS} seeds, got {len(found)}")
    return found
