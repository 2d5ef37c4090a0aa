"""What every experiment adds to its numbers: intervals, per-arrangement rows, the
model-adequacy gate and verdicts, in the result contract's shapes (model_worker.contracts).

An experiment collects them in an `Evidence` as it computes its metrics, and passes it to
`Context.result`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from model_worker.contracts.evidence import AdequacyOut, IntervalOut, VerdictOut
from model_worker.experiments import stats

if TYPE_CHECKING:  # torch-free at run time: the results document imports this module
    from model_worker.experiments.batching import PromptRun

#: the key of the adequacy gate's accuracy among the kept intervals
ADEQUACY = "adequacy accuracy"
#: chance of the two-label argmax
CHANCE = 0.5
#: the tables whose rows pool over seeds (each row's intervals kept as cells), each with the
#: column that names its rows
POOLED_TABLES = {"by_arrangement": "arrangement", "by_mirror_pair": "pair"}
RULE_TEXT = (
    "supported when the 95% interval lies entirely above the null; not supported when it lies "
    "entirely below null + smallest effect (an effect that size is excluded, as is any effect in "
    "the other direction); inconclusive otherwise."
)

Row = dict[str, float | int | str | None]


@dataclass
class Evidence:
    """Named intervals, verdicts and the adequacy gate of one experiment run."""

    intervals: dict[str, stats.Interval] = field(default_factory=dict)
    verdicts: list[stats.Verdict] = field(default_factory=list)
    adequacy: Adequacy | None = None
    #: the intervals in tables' rows (`cell_name`), kept to pool seeds, not results' intervals
    cells: dict[str, stats.Interval] = field(default_factory=dict)

    def add(self, name: str, interval: stats.Interval) -> stats.Interval:
        """Record `interval` under `name` (not when it has no units: it would be NaN)."""
        if interval.n > 0:
            self.intervals[name] = interval
        return interval

    def decide(
        self,
        hypothesis: str,
        quantity: str,
        interval: stats.Interval,
        *,
        null: float = 0.0,
        min_effect: float = 0.0,
        behaviour: bool = False,
    ) -> stats.Verdict:
        """Record the interval under `quantity` and the verdict on `hypothesis` from it
        (`behaviour`: a claim about the model's behaviour, read whatever the adequacy gate
        says; otherwise a head-level claim, read only behind a passed gate)."""
        self.add(quantity, interval)
        found = stats.verdict(hypothesis, quantity, interval, null=null, min_effect=min_effect)
        found = replace(found, needs_adequacy=not behaviour)
        self.verdicts.append(found)
        return found

    def cell(self, table: str, key: str, column: str, interval: stats.Interval) -> Row:
        """`interval_columns(column, interval)` for the row `key` of `table`, the interval kept
        so that the row pools over seeds (POOLED_TABLES)."""
        self.cells[cell_name(table, key, column)] = interval
        return interval_columns(column, interval)

    def kept(self) -> dict[str, stats.Interval]:
        """Every interval with its sample, the tables' cells and the adequacy gate's accuracy
        included (for pooling seeds: model_worker.experiments.seeds)."""
        found = {**self.cells, **self.intervals}
        if self.adequacy is not None:
            found[ADEQUACY] = self.adequacy.accuracy
        return found


@dataclass(frozen=True)
class Adequacy:
    """Does the model do the task above chance under counterbalanced order?"""

    accuracy: stats.Interval
    chance: float
    design: str
    adequate: bool
    note: str


def accuracy_interval(runs: Sequence[PromptRun]) -> stats.Interval:
    """Two-label accuracy with its exact binomial interval."""
    return stats.rate([r.correct for r in runs])


def adequacy(runs: Sequence[PromptRun], design: str) -> Adequacy:
    """The gate: the accuracy interval's lower bound above chance (two labels: 0.5). Only a
    counterbalanced design can pass: under a fixed order, answering from the label sequence
    alone scores well."""
    return adequacy_of([r.correct for r in runs], design)


def adequacy_of(correct: Sequence[bool], design: str) -> Adequacy:
    """`adequacy` from one flag per prompt: is the true label's logit above the false one's?
    (For experiments that do not keep PromptRuns, e.g. patching's clean runs.)"""
    return adequacy_from(stats.rate(correct), design)


def adequacy_from(found: stats.Interval, design: str) -> Adequacy:
    """`adequacy` from the accuracy interval (e.g. pooled over seeds)."""
    above = found.low > CHANCE
    adequate = above and design == "counterbalanced"
    if adequate:
        note = (
            f"The model does the task above chance under counterbalanced order (accuracy "
            f"{found.text(percent=True)}, chance {CHANCE:.0%}): head-level results describe "
            "a model doing ICL on this task."
        )
    elif design != "counterbalanced":
        note = (
            f"Not tested: the {design} design puts the true demonstrations in fixed slots, so "
            f"its accuracy ({found.text(percent=True)}) cannot separate ICL from answering by "
            "position; rerun with the counterbalanced design before reading head-level results."
        )
    else:
        note = (
            f"The model is not shown to do the task above chance under counterbalanced order "
            f"(accuracy {found.text(percent=True)}, chance {CHANCE:.0%}): the head-level "
            "results describe a model that is not doing ICL on this task."
        )
    return Adequacy(found, CHANCE, design, adequate, note)


def cell_name(table: str, key: str, column: str) -> str:
    """The name a table cell's interval is kept under: `by_arrangement[FFTT].accuracy`."""
    return f"{table}[{key}].{column}"


def by_arrangement(
    evidence: Evidence,
    runs: Sequence[PromptRun],
    value: Callable[[PromptRun], float] | None = None,
    name: str = "accuracy",
) -> list[Row]:
    """Per demonstration arrangement (`FFTT`, `FTFT`, …): n, and `name` with its 95% interval
    (accuracy: exact binomial; another per-prompt `value`: bootstrap over prompts), each kept
    in `evidence` as a cell (so the table pools over seeds)."""
    groups: dict[str, list[PromptRun]] = {}
    for r in runs:
        groups.setdefault(r.item.prompt.arrangement, []).append(r)
    rows: list[Row] = []
    for arrangement in sorted(groups):
        members = groups[arrangement]
        found = (
            accuracy_interval(members)
            if value is None
            else stats.bootstrap_mean([value(r) for r in members])
        )
        rows.append(
            {
                "arrangement": arrangement,
                "n": len(members),
                **evidence.cell("by_arrangement", arrangement, name, found),
            }
        )
    return rows


def interval_columns(prefix: str, interval: stats.Interval) -> Row:
    """`{prefix}`, `{prefix}_low`, `{prefix}_high` of a table row (undefined: None)."""
    return {
        prefix: _defined(interval.estimate),
        f"{prefix}_low": _defined(interval.low),
        f"{prefix}_high": _defined(interval.high),
    }


def _defined(value: float) -> float | None:
    return None if math.isnan(value) else value


def interval_out(interval: stats.Interval, seeds: Sequence[int] = ()) -> IntervalOut:
    """The contract's interval; NaN (undefined) becomes None; `seeds`: those it pools."""
    return IntervalOut(
        estimate=_defined(interval.estimate),
        low=_defined(interval.low),
        high=_defined(interval.high),
        n=interval.n,
        method=interval.method,
        level=interval.level,
        undefined=interval.undefined,
        seeds=list(seeds),
    )


def adequacy_out(adequate: Adequacy, seeds: Sequence[int] = ()) -> AdequacyOut:
    """The contract's adequacy gate."""
    return AdequacyOut(
        accuracy=interval_out(adequate.accuracy, seeds),
        chance=adequate.chance,
        design=adequate.design,
        adequate=adequate.adequate,
        note=adequate.note,
    )


def contract_fields(evidence: Evidence) -> dict[str, object]:
    """ExperimentResult's `intervals`, `verdicts` and `adequacy` from `evidence`."""
    adequate = evidence.adequacy
    return {
        "intervals": {k: interval_out(v) for k, v in evidence.intervals.items()},
        "verdicts": [
            VerdictOut(
                hypothesis=v.hypothesis,
                quantity=v.quantity,
                interval=interval_out(v.interval),
                null=v.null,
                min_effect=v.min_effect,
                rule=v.rule,
                outcome=v.outcome,
                needs_adequacy=v.needs_adequacy,
            )
            for v in evidence.verdicts
            if v.interval.n > 0
        ],
        "adequacy": None if adequate is None else adequacy_out(adequate),
    }


def position_effect(runs: Sequence[PromptRun]) -> stats.Interval:
    """Accuracy when the demonstration nearest the input is true minus when it is false
    (independent bootstrap): near 0 for a model that reads the input, large for one that
    copies the nearest label."""
    nearest_true = [float(r.correct) for r in runs if r.item.prompt.arrangement.endswith("T")]
    nearest_false = [float(r.correct) for r in runs if r.item.prompt.arrangement.endswith("F")]
    return stats.bootstrap_diff(nearest_true, nearest_false, paired=False)
