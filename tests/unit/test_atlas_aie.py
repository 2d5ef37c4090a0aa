"""Issue 38.3: the atlas offers Todd et al.'s average indirect effect (exact, the change in the
correct answer's probability) for the top heads by the first-order screen, from each label
assignment's own mean head output; the screen is named as such; one ρ, one interval."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model_worker.datasets import build_prompts
from model_worker.experiments.atlas import FV_EXACT, assignment, mean_outputs
from model_worker.experiments.data import class_of
from model_worker.experiments.job import run_experiment
from tests.tiny_models import tiny_gpt2
from tests.unit.test_experiments import TINY, request


class _Run:
    """What mean_outputs reads of a PromptRun: its prompt and its last-position z."""

    def __init__(self, prompt: object, z: torch.Tensor) -> None:
        self.item = type("Item", (), {"prompt": prompt})()
        self.extra = (z, None)


def test_the_mean_output_never_averages_opposite_label_assignments() -> None:
    classes = class_of(TINY)
    prompts = build_prompts(TINY, 8, seed=0)
    keys = {assignment(p, classes) for p in prompts}
    assert len(keys) == 2  # foo = sentiment or foo = number: opposite tasks
    for p in prompts:
        pairs = dict(assignment(p, classes))
        assert pairs[classes[p.input]] == p.true_label
    # z of +1 under one assignment and −1 under the other: a pooled mean would be 0
    first = assignment(prompts[0], classes)
    runs = [
        _Run(p, torch.full((2, 3), 1.0 if assignment(p, classes) == first else -1.0))
        for p in prompts
    ]
    means = mean_outputs(runs, classes)  # type: ignore[arg-type]
    assert set(means) == keys
    assert torch.equal(means[first], torch.ones(2, 3))
    (other,) = keys - {first}
    assert torch.equal(means[other], -torch.ones(2, 3))


def test_atlas_reports_the_exact_aie_for_the_screens_top_heads(tmp_path: Path) -> None:
    result = run_experiment(tiny_gpt2(), request("atlas", tmp_path, n=8), batch_size=4)
    rows = result.tables["atlas"]
    with_aie = [r for r in rows if r["function_vector_aie"] is not None]
    assert len(with_aie) == min(FV_EXACT, len(rows))
    top = sorted(rows, key=lambda r: -float(r["function_vector"] or 0))[: len(with_aie)]
    assert {r["name"] for r in with_aie} == {r["name"] for r in top}
    for r in with_aie:  # a change of probability, not of the logit difference
        assert -1.0 <= float(r["function_vector_aie"] or 0) <= 1.0
        assert r["function_vector_exact"] is not None
    assert "spearman_fv_screen_aie_top" in result.metrics
    text = " ".join(str(getattr(b, "text", "")) for b in result.report)
    assert "screen" in text and "average indirect effect" in text
    # one ρ, one interval: the verdict's interval is the prompt bootstrap's (the page's)
    (verdict,) = [
        v for v in result.verdicts if v.quantity == "spearman(in_context, function_vector)"
    ]
    (row,) = [
        r
        for r in result.tables["atlas_correlations_prompts"]
        if (r["score_a"], r["score_b"]) == ("in_context", "function_vector")
    ]
    assert verdict.interval.low == row["low"] and verdict.interval.high == row["high"]
    assert verdict.interval.method == "prompt bootstrap"
    assert "screen" in verdict.hypothesis
    assert all("low" not in r for r in result.tables["atlas_correlations"])
    assert verdict.interval.estimate == pytest.approx(float(row["spearman"] or 0))
