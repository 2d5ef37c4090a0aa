"""One experiment run with several seeds, combined into one result (torch-free).

Seeds are more prompts. The combined result pools, over all prompts of all seeds: every
interval, the adequacy gate and every verdict under `COMBINED_RULE` (the interval recomputed
over the seeds' prompts joined, `stats.pool`; the verdict decided from it, each seed's own
verdict kept beside it as a stability check); every metric that has an interval of its own
name (its pooled estimate); and the tables whose rows keep their intervals
(evidence.POOLED_TABLES: each row's intervals pooled, its `n` summed). Everything else — other
metrics, other tables, the figures and the report's text — is the first seed's, and the
result says so: `first_seed_only` names it and a note atop the report lists it. Beside them:
`seeds`; `seed_spread` (each metric, and each interval's estimate, across the seeds: mean,
sample SD, min, max); the table `verdicts_by_seed` (every verdict of every seed). An interval
whose prompts' values a seed did not keep stays the first seed's (its `seeds` empty); a
verdict on one is undecided.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from model_worker.contracts.evidence import AdequacyOut, IntervalOut, SpreadOut, VerdictOut
from model_worker.contracts.experiments import ExperimentResult
from model_worker.contracts.report import Note
from model_worker.experiments import stats
from model_worker.experiments.evidence import (
    ADEQUACY,
    POOLED_TABLES,
    Row,
    adequacy_from,
    adequacy_out,
    cell_name,
    interval_columns,
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


def pooled_metrics(
    first: Mapping[str, float], kept: Sequence[Kept]
) -> tuple[dict[str, float], list[str]]:
    """The first seed's metrics, each with an interval of its own name replaced by that
    interval's estimate over every seed's prompts; and the names of those that stay the first
    seed's (no interval to pool, or one undefined)."""
    metrics, alone = dict(first), []
    for name in first:
        pooled = pooled_interval(name, kept) if all(name in k for k in kept) else None
        if pooled is None or math.isnan(pooled.estimate):
            alone.append(name)
        else:
            metrics[name] = pooled.estimate
    return metrics, alone


def pooled_table(
    name: str, tables: Sequence[Sequence[Row]], kept: Sequence[Kept]
) -> list[Row] | None:
    """Table `name` over every seed's prompts: each row's kept intervals (cells) pooled and
    its `n` summed; None when it cannot be (not one of POOLED_TABLES, rows that differ between
    the seeds, a cell some seed did not keep, or a number in it that no cell gives)."""
    key_column = POOLED_TABLES.get(name)
    if key_column is None or not tables or len(tables) != len(kept):
        return None
    keyed = [{str(row[key_column]): row for row in table} for table in tables]
    if any(
        list(k) != list(keyed[0]) or len(k) != len(t) for k, t in zip(keyed, tables, strict=True)
    ):
        return None
    rows = []
    for key, row in keyed[0].items():
        out, covered = dict(row), {key_column}
        for column in row:
            cell = cell_name(name, key, column)
            pooled = pooled_interval(cell, kept) if all(cell in k for k in kept) else None
            if pooled is not None:
                out.update(interval_columns(column, pooled))
                covered |= {column, f"{column}_low", f"{column}_high"}
        if "n" in row:
            out["n"] = sum(int(k[key]["n"] or 0) for k in keyed)
            covered.add("n")
        numbers = {c for c, v in row.items() if isinstance(v, int | float) and c not in covered}
        if numbers:
            return None
        rows.append(out)
    return rows


def seeds_note(seeds: Sequence[int], alone: Sequence[str]) -> Note:
    """The caveat atop a combined result's report: what is pooled, what is the first seed's."""
    metrics = [a.removeprefix("metrics.") for a in alone if a.startswith("metrics.")]
    tables = [a.removeprefix("tables.") for a in alone if a.startswith("tables.")]
    parts = [
        f"the metrics {', '.join(metrics)}" if metrics else "",
        f"the tables {', '.join(tables)}" if tables else "",
        "the figures" if "figures" in alone else "",
        "the numbers in the text below",
    ]
    return Note(
        text=f"Seeds {', '.join(map(str, seeds))} pooled: the verdicts, intervals, adequacy "
        "gate and the other metrics and tables are over every seed's prompts. Seed "
        f"{seeds[0]}'s alone: {'; '.join(p for p in parts if p)} (each metric's spread across "
        "the seeds is in seed_spread)."
    )


def combine_seeds(
    results: Sequence[ExperimentResult], kept: Sequence[Kept] | None = None
) -> ExperimentResult:
    """The results of one experiment under several seeds, as one result (module docstring);
    `kept`: per result, its intervals with their samples (without them nothing can be pooled:
    every verdict is then undecided, every metric and table the first seed's)."""
    if not results:
        raise ValueError("no results to combine")
    if (
        len(
            {
                (r.name, r.dataset, r.model, r.n, r.design, r.demos_per_label, r.labels)
                for r in results
            }
        )
        != 1
    ):
        raise ValueError("results to combine must differ in their seed only")
    kept = list(kept) if kept is not None else [{} for _ in results]
    if len(kept) != len(results):
        raise ValueError("one set of kept intervals per result")
    seeds = [r.seed for r in results]
    rows: list[Row] = [
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
    update: dict[str, object] = {
        "seeds": seeds,
        "seed_spread": spread_of(results),
        "intervals": intervals,
        "adequacy": pooled_adequacy(first.adequacy, kept, seeds),
        "verdicts": pooled_verdicts(first.verdicts, kept, seeds),
        "tables": {**first.tables, "verdicts_by_seed": rows},
    }
    if len(results) > 1:
        metrics, alone_metrics = pooled_metrics(first.metrics, kept)
        tables = dict(first.tables)
        alone = [f"metrics.{m}" for m in alone_metrics]
        for name in first.tables:
            pooled_rows = pooled_table(name, [r.tables.get(name, []) for r in results], kept)
            if pooled_rows is None:
                alone.append(f"tables.{name}")
            else:
                tables[name] = pooled_rows
        alone += ["figures"] if first.figures else []
        update |= {
            "metrics": metrics,
            "tables": {**tables, "verdicts_by_seed": rows},
            "first_seed_only": [*alone, "report"],
            "report": [seeds_note(seeds, alone), *first.report],
        }
    return first.model_copy(update=update)


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
