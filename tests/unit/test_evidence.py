"""Issue 26's evidence: interval coverage, the verdict rule, distinct random heads, the
sink-free flow, saliency, and the controls and verdicts in experiment results."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from icl_heads.results_doc import render, store
from model_worker.analysis.flow_sink import COLUMNS, sinkless_flow
from model_worker.contracts.experiments import ExperimentResult
from model_worker.datasets import build_prompts, recency_orders
from model_worker.experiments import stats
from model_worker.experiments.batching import make_batches, prepare
from model_worker.experiments.controls import pool_draws, same_layer_draws
from model_worker.experiments.job import run_experiment, run_keeping
from model_worker.experiments.saliency import saliency
from model_worker.experiments.seeds import combine_seeds, parse_seeds
from tests.tiny_models import tiny_gpt2
from tests.unit.test_experiments import TINY, request

# --- intervals -------------------------------------------------------------------------------


def test_bootstrap_interval_covers_a_known_mean_at_the_nominal_rate() -> None:
    """400 synthetic samples of 200 draws from N(1, 2²): the 95% bootstrap interval of the
    mean contains 1 in 95% ± 3% of them."""
    rng = np.random.default_rng(11)
    covered = 0
    for i in range(400):
        sample = rng.normal(1.0, 2.0, size=200)
        found = stats.bootstrap_mean(sample, seed=i, resamples=1000)
        covered += found.low <= 1.0 <= found.high
    assert abs(covered / 400 - 0.95) <= 0.03


def test_exact_binomial_interval_covers_at_least_the_nominal_rate() -> None:
    """Clopper–Pearson is conservative: at least 95% − 3% over 400 samples."""
    rng = np.random.default_rng(5)
    hits = 0
    for _ in range(400):
        found = stats.rate(rng.random(120) < 0.3)
        hits += found.low <= 0.3 <= found.high
    assert hits / 400 >= 0.95 - 0.03


def test_clopper_pearson_known_values() -> None:
    """Reference values (R: binom.test(k, n)$conf.int)."""
    found = stats.clopper_pearson(5, 10)
    assert found.low == pytest.approx(0.187086, abs=1e-5)
    assert found.high == pytest.approx(0.812914, abs=1e-5)
    none = stats.clopper_pearson(0, 10)
    assert none.low == 0.0 and none.high == pytest.approx(0.308497, abs=1e-5)
    every = stats.clopper_pearson(10, 10)
    assert every.high == 1.0 and every.low == pytest.approx(0.691503, abs=1e-5)


def test_bootstrap_is_reproducible_and_paired_differences_are_tighter() -> None:
    rng = np.random.default_rng(2)
    base = rng.normal(0, 1, 150)
    a, b = base + 0.3, base + rng.normal(0, 0.1, 150)
    assert stats.bootstrap_mean(a) == stats.bootstrap_mean(a)
    paired = stats.bootstrap_diff(a, b, paired=True)
    apart = stats.bootstrap_diff(a, b, paired=False)
    assert paired.estimate == pytest.approx(apart.estimate)
    assert paired.high - paired.low < (apart.high - apart.low) / 3


def test_bootstrap_stat_of_a_ratio() -> None:
    cols = [[1.0] * 50 + [0.0] * 50, [0.0] * 100]
    found = stats.bootstrap_stat(cols, lambda c: c[..., 1, :].mean(-1) - c[..., 0, :].mean(-1))
    assert found.estimate == pytest.approx(-0.5)
    assert found.low < -0.5 < found.high


def test_seed_spread() -> None:
    spread = stats.seed_spread([0.5, 0.6, 0.7])
    assert spread.mean == pytest.approx(0.6) and spread.sd == pytest.approx(0.1)
    assert (spread.low, spread.high) == (0.5, 0.7)


# --- the verdict rule ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("low", "high", "outcome"),
    [
        (0.02, 0.3, "supported"),  # the interval lies above 0
        (-0.2, -0.01, "not supported"),  # below 0: the other direction
        (-0.01, 0.04, "not supported"),  # below the smallest effect (0.05): excluded
        (-0.05, 0.2, "inconclusive"),  # straddles 0 and reaches past the smallest effect
        (0.0, 0.2, "inconclusive"),  # touching the null is not above it
    ],
)
def test_verdict_rule_on_synthetic_intervals(low: float, high: float, outcome: str) -> None:
    interval = stats.Interval((low + high) / 2, low, high, 100, "bootstrap")
    found = stats.verdict("x > 0", "x", interval, min_effect=0.05)
    assert found.outcome == outcome
    assert "supported when" in found.rule and "0.05" in found.rule


def test_verdict_on_synthetic_samples() -> None:
    rng = np.random.default_rng(3)
    effect = stats.bootstrap_mean(rng.normal(0.5, 1, 300))
    nothing = stats.bootstrap_mean(rng.normal(0.0, 0.05, 300))
    noisy = stats.bootstrap_mean(rng.normal(0.05, 2, 20))
    assert stats.decide(effect, min_effect=0.1) == "supported"
    assert stats.decide(nothing, min_effect=0.1) == "not supported"
    assert stats.decide(noisy, min_effect=0.1) == "inconclusive"


# --- random baselines ------------------------------------------------------------------------


def test_random_baselines_never_repeat_a_head_within_a_draw() -> None:
    located = [(23, 0), (23, 1), (29, 1), (29, 7)]
    for seed in range(20):
        for draw in same_layer_draws(located, 9, seed, draws=5):
            assert len(set(draw)) == len(draw) == 4
            assert not set(draw) & set(located)
            assert sorted(layer for layer, _ in draw) == [23, 23, 29, 29]
        everyone = [(la, h) for la in range(30) for h in range(9)]
        for draw in pool_draws(located, everyone, seed, draws=5):
            assert len(set(draw)) == len(draw) == 4 and not set(draw) & set(located)
    assert same_layer_draws(located, 9, 0) == same_layer_draws(located, 9, 0)
    assert len({tuple(d) for d in same_layer_draws(located, 9, 0)}) > 1  # draws differ


def test_a_full_layer_contributes_no_more_heads() -> None:
    draw = same_layer_draws([(0, 0), (0, 1), (1, 0)], 3, 0, draws=1)[0]
    assert draw.count((0, 2)) == 1 and len(draw) == 2


# --- flow without the sink; saliency ---------------------------------------------------------


def test_sinkless_flow_drops_token_0_and_reports_its_share() -> None:
    n, labels = 6, [2, 4]
    pattern = torch.zeros(1, n, n)
    pattern[0, :, 0] = 1.0  # every row on the sink
    out = sinkless_flow(pattern, labels)
    assert out.shape == (len(COLUMNS), 1)
    assert torch.equal(out[:3, 0], torch.zeros(3))
    assert out[3, 0] == 1.0 and out[4, 0] == 1.0
    moved = torch.tril(torch.rand(1, n, n))
    moved = moved / moved.sum(-1, keepdim=True)
    found = sinkless_flow(moved, labels)
    demo = [(2, 1), (4, 3)]  # (label, source) pairs without token 0
    assert found[0, 0] == pytest.approx(sum(float(moved[0, d, s]) for d, s in demo) / 2)
    expected_sink = float(moved[0, 2, 0]) / float(moved[0, 2, :2].sum() + moved[0, 4, 3])
    assert found[3, 0] == pytest.approx(expected_sink)


def test_saliency_of_a_padded_batch_equals_each_prompt_alone() -> None:
    loaded = tiny_gpt2()
    items = prepare(
        loaded,
        build_prompts(TINY, 3, seed=1) + build_prompts(TINY, 2, seed=4, variant="imbalanced"),
    )
    assert len({int(i.ids.shape[0]) for i in items}) > 1
    together = saliency(loaded, next(make_batches(items, 8)))
    params = list(loaded.model.parameters())
    assert all(p.grad is None for p in params)  # the model is left untouched
    for row, item in enumerate(items):
        n = item.last + 1
        alone = saliency(loaded, next(make_batches([item], 1)))
        assert torch.allclose(together[row, :, :n, :n], alone[0, :, :n, :n], atol=1e-5)
        assert (together[row] >= 0).all()
        assert torch.equal(
            torch.triu(together[row, :, :n, :n], 1), torch.zeros_like(together[row, :, :n, :n])
        )


# --- results ---------------------------------------------------------------------------------


def test_bias_result_holds_the_minority_false_control(tmp_path: Path) -> None:
    result = run_experiment(tiny_gpt2(), request("bias", tmp_path, n=12), batch_size=6)
    conditions = [str(r["condition"]) for r in result.tables["majority"]]
    assert "control (false label = minority)" in conditions
    assert conditions.count("control + intervention") == 3  # one per a_c
    quantities = {v.quantity for v in result.verdicts}
    assert {"control_gain_ac0.03", "net_gain_ac0.03", "gain_nearest_false"} <= quantities
    assert "gain_nearest_true" in quantities
    assert result.adequacy is not None and result.design == "counterbalanced"
    data = result.model_dump(mode="json")
    assert data["intervals"]["control_gain_ac1"]["method"] == "paired bootstrap"


def test_bias_on_more_demonstrations_runs_six_orders(tmp_path: Path) -> None:
    """8 demonstrations have 70 orders (16 have 12,870): recency compares six of them."""
    asked = request("bias", tmp_path, n=8).model_copy(update={"demos_per_label": 4})
    result = run_experiment(tiny_gpt2(), asked, batch_size=8)
    assert [str(r["order"]) for r in result.tables["recency"]] == recency_orders(4, 4)


# --- seeds and the generated document --------------------------------------------------------


def test_parse_seeds() -> None:
    assert parse_seeds("0,1, 2") == [0, 1, 2]
    assert parse_seeds("3,3") == [3]
    for bad in ("", "a", "1,,2", "1.5", "0x1", ",".join(map(str, range(30)))):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)


@pytest.fixture(scope="module")
def tiny_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, list[tuple[ExperimentResult, dict[str, stats.Interval]]]]:
    """accuracy and ablation of the tiny model under seeds 0 and 1, with their kept
    intervals."""
    loaded, folder = tiny_gpt2(), tmp_path_factory.mktemp("tiny")
    return {
        name: [
            run_keeping(loaded, request(name, folder, n=12, seed=seed), batch_size=6)
            for seed in (0, 1)
        ]
        for name in ("accuracy", "ablation")
    }


@pytest.fixture(scope="module")
def tiny_results(
    tiny_runs: dict[str, list[tuple[ExperimentResult, dict[str, stats.Interval]]]],
) -> dict[str, ExperimentResult]:
    """Each experiment's seeds pooled."""
    return {
        name: combine_seeds([r for r, _ in runs], [k for _, k in runs])
        for name, runs in tiny_runs.items()
    }


def test_seeds_combine_into_one_result(
    tiny_runs: dict[str, list[tuple[ExperimentResult, dict[str, stats.Interval]]]],
) -> None:
    results = [r for r, _ in tiny_runs["accuracy"]]
    combined = combine_seeds(results, [k for _, k in tiny_runs["accuracy"]])
    assert combined.seeds == [0, 1]
    spread = combined.seed_spread["accuracy"]
    values = [r.metrics["accuracy"] for r in results]
    assert spread.values == values and spread.mean == pytest.approx(sum(values) / 2)
    rows = combined.tables["verdicts_by_seed"]
    assert {row["seed"] for row in rows} == {0, 1}
    correct = sum(round(r.metrics["accuracy"] * r.intervals["accuracy"].n) for r in results)
    total = sum(r.intervals["accuracy"].n for r in results)
    pooled = stats.clopper_pearson(correct, total)
    assert combined.intervals["accuracy"].low == pytest.approx(pooled.low)
    for verdict in combined.verdicts:  # decided from the pooled interval, not by vote
        assert verdict.interval.seeds == [0, 1] and verdict.rule.startswith("pooled over seeds")
        assert verdict.interval.n == sum(
            r.intervals[verdict.quantity].n for r in results if verdict.quantity in r.intervals
        )
    with pytest.raises(ValueError, match="differ in their seed only"):
        combine_seeds([results[0], tiny_runs["ablation"][1][0]])


def test_generated_results_document_is_byte_identical_on_a_second_run(
    tiny_results: dict[str, ExperimentResult], tmp_path: Path
) -> None:
    folder = tmp_path / "results"
    for result in tiny_results.values():
        store(result, folder)
    first = render(folder)
    assert render(folder) == first
    stored = sorted(p.read_bytes() for p in folder.glob("*.json"))
    for result in tiny_results.values():  # storing the same results again: same bytes
        store(result, folder)
    assert sorted(p.read_bytes() for p in folder.glob("*.json")) == stored
    assert render(folder) == first
    for result in tiny_results.values():
        for verdict in result.verdicts:
            shown = (
                f"the measurement alone: {verdict.outcome})"
                if verdict.behind(result.adequacy)
                else f"**{verdict.outcome}**"
            )
            assert f"`{verdict.quantity}`" in first and shown in first
    assert "(later version, unverified)" in first
    assert "| zeroing ~1% of heads" in first and "cannot test" in first  # gate or n


def test_rendered_document_states_how_each_run_ran_and_which_intervals_are_wide(
    tiny_results: dict[str, ExperimentResult], tmp_path: Path
) -> None:
    folder = tmp_path / "results"
    run = {
        "command": "scripts/results.py run accuracy:0,1@12",
        "cpu": "Test CPU",
        "cores": 2,
        "nice": 15,
        "load_before": 9.5,
        "load_after": 10.25,
        "wall_s": 123,
        "cpu_s": 45,
        "finished": "2026-01-01 00:00 UTC",
    }
    for result in tiny_results.values():
        store(result, folder, run=run)
    first = render(folder)
    assert render(folder) == first  # still byte-identical
    assert "123 s wall (45 s CPU) on Test CPU, 2 cores" in first
    assert "load average 9.5 → 10.25" in first
    section = first[first.index("## Sample sizes and precision") :]
    section = section[: section.index("\n## ", 5)]
    # n = 12: the accuracy interval is far wider than ±5 points, and listed with its width
    assert "| `accuracy` | 12 | 0, 1 | " in section and "`accuracy_minus_chance` (±0." in section
    assert "In words: of the" in first


def test_cli_seeds_and_design_bad_input_exit_2_with_one_line() -> None:
    from typer.testing import CliRunner

    from icl_heads.cli import app

    cases = [
        (["experiment", "accuracy", "--seeds", "0,x"], "--seeds must be integers"),
        (["experiment", "accuracy", "--seeds", ""], "--seeds must be integers"),
        (["experiment", "accuracy", "--design", "random"], "'counterbalanced', 'fftt'"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, result.stderr)
