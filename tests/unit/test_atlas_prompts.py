"""The atlas's prompt bootstrap (model_worker.experiments.atlas_prompts): scores recomputed from
resampled prompts; an interval that resamples prompts, not heads (no prompt-to-prompt variation:
no width, however the heads scatter); the estimate equals ρ on the full data."""

from __future__ import annotations

import numpy as np
import pytest

from model_worker.analysis.atlas import spearman
from model_worker.experiments.atlas_prompts import prompt_correlations, resampled_scores

SCORES = ("in_context", "label_share", "induction", "function_vector", "sink")


def _data(noise: float, n: int = 20, heads: int = 30, m: int = 8) -> tuple[dict, dict, dict]:
    rng = np.random.default_rng(1)
    base = rng.normal(size=heads)
    per_prompt = {
        "in_context": np.abs(base) + noise * rng.normal(size=(n, heads)),
        "label_increase": 0.5 * np.abs(base) + noise * rng.normal(size=(n, heads)),
        "sink": rng.uniform(size=heads) + noise * rng.normal(size=(n, heads)),
    }
    subset = {"function_vector": base + noise * rng.normal(size=(m, heads))}
    fixed = {"induction": rng.normal(size=heads)}
    return per_prompt, subset, fixed


def _full(per_prompt: dict, subset: dict, fixed: dict) -> dict[str, np.ndarray]:
    increase = per_prompt["in_context"].mean(0)
    label = per_prompt["label_increase"].mean(0)
    return {
        "in_context": increase,
        "label_share": np.where(increase > 0, label / increase, np.nan),
        "sink": per_prompt["sink"].mean(0),
        "function_vector": subset["function_vector"].mean(0),
        "induction": fixed["induction"],
    }


def test_without_prompt_variation_the_interval_is_undefined_not_x_x() -> None:
    """Issue 38.4: resamples that cannot differ give no interval ([x, x] before)."""
    per_prompt, subset, fixed = _data(noise=0.0)
    values = _full(per_prompt, subset, fixed)
    rows = prompt_correlations(
        values, resampled_scores(per_prompt, subset, fixed, resamples=200), SCORES, 20
    )
    for row in rows:
        assert row["low"] is None and row["high"] is None
        assert row["undefined"] is not None
    assert any("same ρ" in str(row["undefined"]) for row in rows)


def test_too_few_usable_resamples_give_an_undefined_interval() -> None:
    """Issue 38.4: at n = 8 the function-vector rows used 1 of 1,000 resamples and printed
    [0.173, 0.173]; a ρ defined in under half the resamples now has no interval."""
    per_prompt, subset, fixed = _data(noise=0.5)
    values = _full(per_prompt, subset, fixed)
    draws = resampled_scores(per_prompt, subset, fixed, resamples=400)
    draws["function_vector"] = draws["function_vector"].copy()
    draws["function_vector"][1:] = np.nan  # defined in 1 resample of 400
    rows = {(r["score_a"], r["score_b"]): r for r in prompt_correlations(values, draws, SCORES, 8)}
    pair = rows[("in_context", "function_vector")]
    assert pair["low"] is None and pair["high"] is None and pair["resamples"] == 1
    assert pair["undefined"] == "1 of 400 resamples usable"


def test_with_prompt_variation_the_interval_holds_the_estimate() -> None:
    per_prompt, subset, fixed = _data(noise=0.5)
    values = _full(per_prompt, subset, fixed)
    draws = resampled_scores(per_prompt, subset, fixed, resamples=400)
    assert draws["function_vector"].shape == (400, 30)
    assert np.all(draws["induction"] == fixed["induction"])  # not from the prompts
    rows = {(r["score_a"], r["score_b"]): r for r in prompt_correlations(values, draws, SCORES, 20)}
    pair = rows[("in_context", "function_vector")]
    expected = spearman(np.stack([values["in_context"], values["function_vector"]]))
    assert pair["spearman"] == pytest.approx(float(expected))
    assert pair["low"] < pair["spearman"] < pair["high"]  # type: ignore[operator]
    assert pair["prompts"] == 20 and pair["resamples"] == 400
