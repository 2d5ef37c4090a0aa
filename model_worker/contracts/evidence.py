"""The evidence of an experiment result (torch-free): intervals, verdicts, the model-adequacy
gate and the spread between seeds. Computed by model_worker.experiments.stats; every field of
ExperimentResult that holds them defaults to empty, so results stored before them still load.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

#: how the demonstrations of an experiment's prompts are ordered: every true/false arrangement
#: equally often (default), or the paper's two false then two true ("fftt": the true ones
#: nearest the input, which lets a model answer from position alone)
Design = Literal["counterbalanced", "fftt"]
DESIGNS: tuple[str, ...] = ("counterbalanced", "fftt")
#: how the demonstrations are labelled: foo/bar (the paper's, "arbitrary") or each class's own
#: name ("meaningful")
LabelStyle = Literal["arbitrary", "meaningful"]
Outcome = Literal["supported", "not supported", "inconclusive"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class IntervalOut(_Frozen):
    """An estimate with its `level` interval, from `n` units (prompts) by `method`
    (bootstrap, paired bootstrap, clopper-pearson). None: undefined (e.g. a reduction of a
    change that is zero; bounds the data cannot support, `undefined` saying why). `seeds`: the
    seeds whose prompts it pools (empty: one run)."""

    estimate: float | None
    low: float | None
    high: float | None
    n: int
    method: str
    level: float = 0.95
    undefined: str | None = None
    seeds: list[int] = []


class VerdictOut(_Frozen):
    """A hypothesis ("`quantity` > `null`"), the interval deciding it, the rule and outcome."""

    hypothesis: str
    quantity: str
    interval: IntervalOut
    null: float
    min_effect: float
    rule: str
    outcome: Outcome
    #: a head-level claim, read only when the model passes the adequacy gate (False: a claim
    #: about the model's behaviour itself, e.g. its accuracy)
    needs_adequacy: bool = True

    def behind(self, adequacy: AdequacyOut | None) -> bool:
        """Is this verdict behind a failed gate (a measurement, not a finding about ICL)?"""
        return self.needs_adequacy and adequacy is not None and not adequacy.adequate


class AdequacyOut(_Frozen):
    """Whether the model does the task above chance under counterbalanced order."""

    accuracy: IntervalOut
    chance: float
    design: str
    adequate: bool
    note: str


class SpreadOut(_Frozen):
    """One metric across seeds."""

    mean: float
    sd: float
    min: float
    max: float
    values: list[float]
