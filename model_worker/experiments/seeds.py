"""One experiment run with several seeds, combined into one result (torch-free).

The combined result is the first seed's, plus: `seeds`; `seed_spread` (each metric, and each
interval's estimate, across the seeds: mean, sample SD, min, max); the table `verdicts_by_seed`
(every verdict of every seed); and `verdicts` replaced by the combined verdicts under the rule
`COMBINED_RULE`: a hypothesis is supported (not supported) when it is so in every seed, and
inconclusive otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

from model_worker.contracts.evidence import SpreadOut, VerdictOut
from model_worker.contracts.experiments import ExperimentResult
from model_worker.experiments.stats import seed_spread

COMBINED_RULE = (
    "combined over seeds: supported (not supported) when every seed's verdict is; "
    "inconclusive otherwise. Each seed's rule: "
)


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
            spread = seed_spread(seen)
            out[name] = SpreadOut(
                mean=spread.mean,
                sd=spread.sd,
                min=spread.low,
                max=spread.high,
                values=list(spread.values),
            )
    return out


def combined_verdicts(results: Sequence[ExperimentResult]) -> list[VerdictOut]:
    """The first seed's verdicts with the outcome combined over every seed (COMBINED_RULE)."""
    out = []
    for verdict in results[0].verdicts:
        outcomes = [
            v.outcome for r in results for v in r.verdicts if v.quantity == verdict.quantity
        ]
        if len(outcomes) == len(results) and len(set(outcomes)) == 1:
            outcome = outcomes[0]
        else:
            outcome = "inconclusive"
        out.append(
            verdict.model_copy(update={"outcome": outcome, "rule": COMBINED_RULE + verdict.rule})
        )
    return out


def combine_seeds(results: Sequence[ExperimentResult]) -> ExperimentResult:
    """The results of one experiment under several seeds, as one result (module docstring)."""
    if not results:
        raise ValueError("no results to combine")
    if len({(r.name, r.dataset, r.model, r.n, r.design) for r in results}) != 1:
        raise ValueError("results to combine must differ in their seed only")
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
    return first.model_copy(
        update={
            "seeds": [r.seed for r in results],
            "seed_spread": spread_of(results),
            "verdicts": combined_verdicts(results),
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
