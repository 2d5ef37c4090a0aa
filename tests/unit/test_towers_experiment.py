"""Experiment `towers` on a tiny model: Δ's parts add up, the verdicts follow their intervals,
the shares are shares."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_worker.experiments import stats
from model_worker.experiments.job import run_experiment
from tests.tiny_models import tiny_llama
from tests.unit.test_experiments import request


def test_towers_experiment(tmp_path: Path) -> None:
    result = run_experiment(tiny_llama(), request("towers", tmp_path, n=6), batch_size=3)
    parts = {row["part"]: row for row in result.tables["delta_parts"]}
    total = sum(float(parts[name]["share"] or 0) for name in ("label", "input", "other"))
    assert total == pytest.approx(1.0, abs=1e-6)
    for row in result.tables["components"]:
        share, low, high = (float(row[k] or 0) for k in ("share", "share_low", "share_high"))
        assert 0 <= low <= share <= high <= 1
    for row in result.tables["recurrence"]:
        assert 0 < float(row["recurrence"] or 0) <= 1
    assert len(result.verdicts) == 2
    for found in result.verdicts:
        interval = stats.Interval(
            found.interval.estimate or float("nan"),
            found.interval.low if found.interval.low is not None else float("nan"),
            found.interval.high if found.interval.high is not None else float("nan"),
            found.interval.n,
            found.interval.method,
        )
        assert found.outcome == stats.decide(interval, null=found.null, min_effect=found.min_effect)
    assert "delta_parts" in result.figures
