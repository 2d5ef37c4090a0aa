"""The per-request budget: the cost model and the 422 message that names the knob to lower."""

from __future__ import annotations

import pytest

from model_worker.checks.budget import BudgetError, analysis_cost, check_analysis, check_experiment
from model_worker.common.errors import UserInputError
from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.contracts.experiments import ExperimentRequest
from model_worker.model.loading import LoadedModel
from model_worker.service.jobs import run_analysis
from tests.tiny_models import EXAMPLE_PROMPT


def test_cost_is_tokens_times_heads_times_token_views() -> None:
    request = AnalysisRequest(prompt="x", top_k_heads=20, top_k_tokens=10)
    assert analysis_cost(512, request) == 512 * 20 * (2 * 10 + 4)
    extra = request.model_copy(update={"extra_heads": ["L1H1", "L1H1", "L2H0"]})
    assert analysis_cost(100, extra) == 100 * 22 * 24  # duplicates count once


def test_the_default_request_fits_the_default_budget_at_the_token_limit() -> None:
    """Settings defaults: 512 tokens, 20 heads + one head on demand, 10 tokens: within 300,000."""
    request = AnalysisRequest(prompt="x", extra_heads=["L0H0"])
    check_analysis(512, request, 300_000)


@pytest.mark.parametrize(
    ("tokens", "heads", "k", "max_heads", "max_k"),
    [
        (512, 200, 50, 5, None),  # 300,000 // (512 × 104) = 5; no k fits 200 heads
        (512, 200, 1, 97, None),
        (256, 40, 50, 11, 12),  # (300,000 // (256 × 40) − 4) // 2 = 12
    ],
)
def test_over_budget_names_the_knob_and_the_largest_value_that_fits(
    tokens: int, heads: int, k: int, max_heads: int, max_k: int | None
) -> None:
    request = AnalysisRequest(prompt="x", top_k_heads=heads, top_k_tokens=k)
    with pytest.raises(BudgetError) as caught:
        check_analysis(tokens, request, 300_000)
    message = str(caught.value)
    assert "ICL_MAX_ANALYSIS_COST" in message and f"{analysis_cost(tokens, request):,}" in message
    assert f"lower top_k_heads to {max_heads}" in message
    check_analysis(tokens, request.model_copy(update={"top_k_heads": max_heads}), 300_000)
    with pytest.raises(BudgetError):
        check_analysis(tokens, request.model_copy(update={"top_k_heads": max_heads + 1}), 300_000)
    if max_k is None:
        assert "top_k_tokens to" not in message
    else:
        assert f"top_k_tokens to {max_k}" in message
        check_analysis(tokens, request.model_copy(update={"top_k_tokens": max_k}), 300_000)


def test_experiments_are_bounded_by_n() -> None:
    check_experiment(ExperimentRequest(name="heads", dataset="d", n=200), 200)
    with pytest.raises(BudgetError, match="lower n"):
        check_experiment(ExperimentRequest(name="heads", dataset="d", n=201), 200)


def test_a_worker_refuses_an_over_budget_request_itself(
    tiny_model: LoadedModel,
) -> None:
    """Every path to a worker holds the budget (the web tier may lack the tokenizer)."""
    settings = Settings(max_analysis_cost=500)
    with pytest.raises(UserInputError, match="lower top_k_heads to"):
        run_analysis(
            tiny_model, AnalysisRequest(prompt=EXAMPLE_PROMPT, top_k_heads=12), settings=settings
        )
    request = AnalysisRequest(prompt="a : b c :", top_k_heads=1)
    assert run_analysis(tiny_model, request, settings=settings)
