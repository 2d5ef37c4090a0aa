"""Job functions: what a worker (RQ or embedded) runs for one request."""

from __future__ import annotations

from app.contracts import AnalysisRequest, AnalysisResult
from app.settings import get_settings
from model_worker.analyze import analyze
from model_worker.loading import LoadedModel


def run_analysis(loaded: LoadedModel, request: AnalysisRequest) -> AnalysisResult:
    """Analyse `request` on the loaded model, within the configured prompt limit."""
    return analyze(
        loaded,
        request.prompt,
        target=request.target,
        labels=request.labels,
        norm=request.norm,
        top_k_heads=request.top_k_heads,
        top_k_tokens=request.top_k_tokens,
        extra_heads=request.extra_heads,
        max_tokens=get_settings().max_prompt_tokens,
    )
