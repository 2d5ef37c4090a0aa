"""Issue 38.6 and 38.4: seeds pooled as more prompts (each verdict from the interval over all
prompts of all seeds, each seed's verdict beside it), and intervals the data cannot support
reported as undefined, never [x, x]."""

from __future__ import annotations

import math

import numpy as np
import pytest

from model_worker.contracts.experiments import ExperimentResult
from model_worker.experiments import stats
from model_worker.experiments.bias import majority_reduction_of as reduction
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


def test_a_statistic_undefined_on_the_prompts_has_no_interval() -> None:
    """The reduction of a bias that is 0 on the prompts (16 demonstrations: removing one true
    one changed no answer) is undefined; the resamples where it is defined do not bound it
    (before: stored as [0, 0] beside an undefined estimate)."""
    balanced = [1.0] * 10 + [0.0, 1.0]
    imbalanced = [1.0] * 10 + [1.0, 0.0]  # the same accuracy: no bias before
    found = stats.bootstrap_stat([balanced, imbalanced, imbalanced], reduction)
    assert math.isnan(found.estimate) and math.isnan(found.low) and math.isnan(found.high)
    assert found.undefined is not None and found.undefined.startswith("the estimate is undefined")
    assert stats.decide(found) == "inconclusive"


def test_a_bootstrap_with_no_spread_is_undefined_not_x_x() -> None:
    found = stats.bootstrap_mean([0.25] * 12)
    assert found.estimate == 0.25 and math.isnan(found.low) and math.isnan(found.high)
    assert found.undefined == "every prompt gives the same value"
    one = stats.bootstrap_mean([0.5])
    assert math.isnan(one.low) and one.undefined == "fewer than 2 prompts"
    out = contract_fields(Evidence(intervals={"x": found}))["intervals"]
    assert out["x"].low is None and out["x"].undefined == found.undefined  # type: ignore[index]


# --- metrics and tables over every seed's prompts -------------------------------------------


def _arrangement_run(
    seed: int, counts: dict[str, tuple[int, int]]
) -> tuple[ExperimentResult, dict[str, stats.Interval]]:
    """A run whose `by_arrangement` rows have `counts[arrangement] = (correct, n)`, whose
    metric `accuracy` has an interval of its name, and whose `location` table and metric
    `n_heads` have none (they cannot pool)."""
    evidence = Evidence()
    rows = []
    flags: list[bool] = []
    for arrangement, (correct, n) in counts.items():
        these = [True] * correct + [False] * (n - correct)
        flags += these
        rows.append(
            {
                "arrangement": arrangement,
                "n": n,
                **evidence.cell("by_arrangement", arrangement, "accuracy", stats.rate(these)),
            }
        )
    evidence.add("accuracy", stats.rate(flags))
    result = ExperimentResult(
        name="accuracy",
        model="m",
        dataset="d",
        n=len(flags),
        seed=seed,
        metrics={"accuracy": sum(flags) / len(flags), "n_heads": 4.0 + seed},
        tables={"by_arrangement": rows, "location": [{"head": f"L{seed}H0", "score": 0.1}]},
        figures={},
        **contract_fields(evidence),  # type: ignore[arg-type]
    )
    return result, evidence.kept()


def test_a_combined_result_pools_its_metrics_and_arrangement_rows_over_every_seed() -> None:
    """Seed 0: FFTT 10/10, TTFF 0/10; seed 1: FFTT 2/10, TTFF 8/10. Pooled: FFTT 12/20,
    TTFF 8/20, accuracy 20/40; the first seed's alone said 1.0 and 0.0."""
    runs = [
        _arrangement_run(0, {"FFTT": (10, 10), "TTFF": (0, 10)}),
        _arrangement_run(1, {"FFTT": (2, 10), "TTFF": (8, 10)}),
    ]
    combined = combine_seeds([r for r, _ in runs], [k for _, k in runs])
    assert combined.metrics["accuracy"] == pytest.approx(0.5)
    fftt, ttff = combined.tables["by_arrangement"]
    expected = stats.clopper_pearson(12, 20)
    assert fftt["arrangement"] == "FFTT" and fftt["n"] == 20
    assert fftt["accuracy"] == pytest.approx(0.6)
    assert (fftt["accuracy_low"], fftt["accuracy_high"]) == pytest.approx(
        (expected.low, expected.high)
    )
    assert ttff["n"] == 20 and ttff["accuracy"] == pytest.approx(0.4)
    # what cannot pool stays the first seed's, and the result says so, in data and in words
    assert combined.metrics["n_heads"] == 4.0
    assert combined.tables["location"] == runs[0][0].tables["location"]
    assert combined.first_seed_only == ["metrics.n_heads", "tables.location", "report"]
    note = combined.report[0]
    assert note.kind == "note" and "Seed 0's alone: the metrics n_heads; the tables location" in (
        note.text
    )


def test_a_table_whose_rows_differ_between_seeds_stays_the_first_seeds() -> None:
    runs = [
        _arrangement_run(0, {"FFTT": (10, 10), "TTFF": (0, 10)}),
        _arrangement_run(1, {"FFTT": (2, 20)}),
    ]
    combined = combine_seeds([r for r, _ in runs], [k for _, k in runs])
    assert combined.tables["by_arrangement"] == runs[0][0].tables["by_arrangement"]
    assert "tables.by_arrangement" in combined.first_seed_only


def test_one_seed_is_its_own_pool_and_says_nothing_about_seeds() -> None:
    run = _arrangement_run(0, {"FFTT": (10, 10), "TTFF": (0, 10)})
    combined = combine_seeds([run[0]], [run[1]])
    assert combined.first_seed_only == [] and combined.report == run[0].report
    assert combined.tables["by_arrangement"] == run[0].tables["by_arrangement"]


def test_results_of_different_designs_do_not_combine() -> None:
    first = _arrangement_run(0, {"FFTT": (10, 10)})[0]
    other = first.model_copy(update={"seed": 1, "demos_per_label": 8, "labels": "meaningful"})
    with pytest.raises(ValueError, match="seed only"):
        combine_seeds([first, other])


def test_the_attention_rho_pools_over_seeds_as_the_joined_prompts() -> None:
    """The ρ(attention, increase) interval resamples whole prompts; pooled over two seeds it is
    the interval of the prompts joined (today it could not pool: no sample kept)."""
    from model_worker.experiments.attention import _rho_interval

    rng = np.random.default_rng(7)

    def points(prompts: range) -> list[dict[str, float | int | str | None]]:
        return [
            {"prompt": p, "attention": a, "increase": a + rng.normal(0, 0.5)}
            for p in prompts
            for a in rng.uniform(0, 1, 3 + p % 2)  # prompts of 3 and of 4 points
        ]

    first, second = points(range(12)), points(range(15))
    pooled = stats.pool([_rho_interval(first), _rho_interval(second)])
    renumbered = [{**p, "prompt": int(p["prompt"] or 0) + 100} for p in second]
    joined = _rho_interval(first + renumbered)
    assert pooled.n == 27 and not math.isnan(pooled.low)
    assert (pooled.estimate, pooled.low, pooled.high) == pytest.approx(
        (joined.estimate, joined.low, joined.high)
    )
