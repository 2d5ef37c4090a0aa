"""The two-tower views on the real default model, SmolLM2-135M-Instruct, with the paper's
prompt (`love : bar like : bar eight : foo two : foo one :`)."""

from __future__ import annotations

import pytest
import torch

from model_worker.contracts.experiments import ExperimentRequest
from model_worker.contracts.report import plain_text
from model_worker.experiments.job import run_experiment
from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT

pytestmark = pytest.mark.slow


def test_label_share_separates_l29h1_from_l23h1(smollm2: LoadedModel) -> None:
    """Measured: L29H1 +0.913 of which +0.027 from its label positions (share 0.03; +0.889
    from the rest, mostly the last ':'); L23H1 +0.989, all of it from the labels (share 1.00)."""
    result = analyze(smollm2, EXAMPLE_PROMPT)
    l29h1, l23h1 = result.head("L29H1"), result.head("L23H1")
    assert l29h1.increase == pytest.approx(0.913, abs=0.05)
    assert l29h1.label_increase == pytest.approx(0.027, abs=0.03)
    assert l29h1.other_increase == pytest.approx(0.889, abs=0.05)
    assert l29h1.label_share is not None and l29h1.label_share < 0.1
    assert l23h1.increase == pytest.approx(0.989, abs=0.05)
    assert l23h1.label_share is not None and l23h1.label_share == pytest.approx(1.0, abs=0.05)
    by_label = analyze(smollm2, EXAMPLE_PROMPT, rank_by="label", top_k_heads=10)
    assert "L23H1" in by_label.top_heads and "L29H1" not in by_label.top_heads


def test_scores_reproduce_the_attention_of_every_detailed_head(smollm2: LoadedModel) -> None:
    result = analyze(smollm2, EXAMPLE_PROMPT)
    assert len(result.head_details) == 20
    for detail in result.head_details.values():
        scores = torch.tensor(detail.scores)
        assert (scores.softmax(-1) - torch.tensor(detail.attention)).abs().max() <= 1e-5
        assert detail.position_scores is not None
        split = torch.tensor(detail.content_scores) + torch.tensor(detail.position_scores)
        assert (split - scores).abs().max() <= 1e-4
        assert len(detail.query_by_offset) == 4  # every label of the paper's prompt
    # L23H1 scores the two true ('foo') label positions highest
    detail = result.head_details["L23H1"]
    ranked = sorted(result.labels, key=lambda label: -float(detail.scores[label.position] or 0))
    assert [label.is_true for label in ranked[:2]] == [True, True]


@pytest.mark.timeout(1200)  # locating the heads zeroes 8 candidates: slow on a busy CPU
def test_matching_runs_end_to_end_on_a_few_prompts(smollm2: LoadedModel) -> None:
    request = ExperimentRequest(name="matching", dataset="sentiment-number", n=2)
    result = run_experiment(smollm2, request, batch_size=8)
    assert result.metrics["n_cases"] == 8  # 2 prompts × 4 demonstrations
    rows = result.tables["matching"]
    assert sum(r["kind"] == "located" for r in rows) == 4
    assert sum(r["kind"] != "located" for r in rows) == 4
    assert "Label share" in plain_text(result.report)
    assert 0.0 <= result.metrics["located_argmax_is_own_label"] <= 1.0
