"""Issue 38.6 and 38.4: seeds pooled as more prompts (each verdict from the interval over all
prompts of all seeds, each seed's verdict beside it), and intervals the data cannot support
reported as undefined, never [x, x]."""

from __future__ import annotations

import math

import numpy as np
import pytest

from model_worker.contracts.experiments import ExperimentResult
from model_worker.experiments import stats
from model_worker.experiments.evidence import Evidence, adequacy_of, contract_fields
from model_worker.experiments.seeds import COMBINED_RULE, combine_seeds


def _seed_run(
    seed: int, correct: int, n: int
) -> tuple[ExperimentResult, dict[str, stats.Interval]]:
    """An accuracy run of `n` prompts, `correct` of them right: its result and kept intervals."""
    flags = [True] * correct + [False] * (n - correct)
    evidence = Evidence(adequacy=adequacy_of(flags, "counterbalanced"))
    evidence.decide(
        "above chance", "accuracy_minus_chance", stats.rate(flags).shifted(0.5), min_effect=0.05
    )
    result = ExperimentResult(
        name="accuracy",
        model="m",
        dataset="d",
        n=n,
        seed=seed,
        metrics={"accuracy": correct / n},
        tables={},
        figures={},
        **contract_fields(evidence),  # type: ignore[arg-type]
    )
    return result, evidence.kept()


def test_the_pooled_rule_decides_from_all_prompts_of_all_seeds() -> None:
    """The issue's counts: seed 0 alone 214/400 (53.5%, its interval reaches below chance),
    seeds 1 and 2 above chance; pooled 688/1200 = 57.3% [54.5, 60.2] passes. Under the old
    rule (every seed must agree) the verdict was inconclusive and the gate failed on seed 0."""
    runs = [_seed_run(0, 214, 400), _seed_run(1, 232, 400), _seed_run(2, 242, 400)]
    assert [r.verdicts[0].outcome for r, _ in runs] == ["inconclusive", "supported", "supported"]
    combined = combine_seeds([r for r, _ in runs], [k for _, k in runs])
    (verdict,) = combined.verdicts
    expected = stats.clopper_pearson(688, 1200)
    assert verdict.interval.n == 1200 and verdict.interval.seeds == [0, 1, 2]
    assert verdict.interval.estimate == pytest.approx(688 / 1200 - 0.5)
    assert verdict.interval.low == pytest.approx(expected.low - 0.5)
    assert verdict.interval.high == pytest.approx(expected.high - 0.5)
    assert round(100 * expected.low, 1) == 54.5 and round(100 * expected.high, 1) == 60.2
    assert verdict.outcome == "supported" and verdict.rule.startswith(COMBINED_RULE)
    # the gate: pooled too, its note names the pooled accuracy
    assert combined.adequacy is not None and combined.adequacy.adequate
    assert combined.adequacy.accuracy.n == 1200 and "57.3%" in combined.adequacy.note
    # each seed's own verdict stays beside it as a stability check
    rows = combined.tables["verdicts_by_seed"]
    assert [(r["seed"], r["outcome"]) for r in rows] == [
        (0, "inconclusive"),
        (1, "supported"),
        (2, "supported"),
    ]
    assert combined.intervals["accuracy_minus_chance"].n == 1200


def test_pooled_seeds_can_also_fail_where_every_seed_alone_is_inconclusive() -> None:
    """Nine seeds of 100 prompts at 50–51%: each inconclusive; pooled (900 prompts) the
    interval lies below chance + 0.05 → not supported."""
    runs = [_seed_run(s, 51, 100) for s in range(3)]
    runs += [_seed_run(s, 50, 100) for s in range(3, 9)]
    assert {r.verdicts[0].outcome for r, _ in runs} == {"inconclusive"}
    combined = combine_seeds([r for r, _ in runs], [k for _, k in runs])
    assert combined.verdicts[0].outcome == "not supported"


def test_without_kept_values_a_verdict_is_undecided_not_voted() -> None:
    runs = [_seed_run(0, 300, 400), _seed_run(1, 300, 400)]
    combined = combine_seeds([r for r, _ in runs])
    (verdict,) = combined.verdicts
    assert verdict.outcome == "inconclusive" and verdict.interval.low is None
    assert verdict.interval.undefined is not None


def test_pooling_a_bootstrap_equals_the_bootstrap_of_the_joined_prompts() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.normal(0.1, 1, 60), rng.normal(0.3, 1, 80)
    pooled = stats.pool([stats.bootstrap_mean(a), stats.bootstrap_mean(b)])
    joined = stats.bootstrap_mean(np.concatenate([a, b]))
    assert (pooled.estimate, pooled.low, pooled.high, pooled.n) == (
        joined.estimate,
        joined.low,
        joined.high,
        140,
    )
    x, y = rng.normal(0, 1, (2, 50))
    shifted = stats.pool(
        [stats.bootstrap_diff(x, y, paired=True).shifted(0.2)] * 2
    )  # the same prompts twice
    again = stats.bootstrap_diff(np.tile(x, 2), np.tile(y, 2), paired=True).shifted(0.2)
    assert shifted.low == pytest.approx(again.low) and shifted.method == "paired bootstrap"
    rows = rng.normal(0, 1, (30, 6))
    over = stats.pool(
        [stats.bootstrap_over_heads(rows[:10], stats.share_above())] * 1
        + [stats.bootstrap_over_heads(rows[10:], stats.share_above())]
    )
    assert over.estimate == stats.bootstrap_over_heads(rows, stats.share_above()).estimate


# --- intervals the data cannot support ------------------------------------------------------


def test_a_bootstrap_with_too_few_usable_resamples_is_undefined_not_x_x() -> None:
    """The atlas's case: a statistic defined in 1 of the resamples used to print [x, x]."""
    values = np.zeros((2, 8))
    values[0, 0] = 1.0  # the statistic is defined only when prompt 0 is drawn… at most once

    def rare(c: np.ndarray) -> np.ndarray:
        hits = c[..., 0, :].sum(-1)
        return np.where(hits >= 3, hits, np.nan)  # defined in a small share of resamples

    found = stats.bootstrap_stat(values, rare)
    assert math.isnan(found.low) and math.isnan(found.high)
    assert found.undefined is not None and "resamples usable" in found.undefined
    assert "undefined" in found.text()
    assert stats.decide(found) == "inconclusive"


def test_a_bootstrap_with_no_spread_is_undefined_not_x_x() -> None:
    found = stats.bootstrap_mean([0.25] * 12)
    assert found.estimate == 0.25 and math.isnan(found.low) and math.isnan(found.high)
    assert found.undefined == "every prompt gives the same value"
    one = stats.bootstrap_mean([0.5])
    assert math.isnan(one.low) and one.undefined == "fewer than 2 prompts"
    out = contract_fields(Evidence(intervals={"x": found}))["intervals"]
    assert out["x"].low is None and out["x"].undefined == found.undefined  # type: ignore[index]
