"""The local library calls (torch and the model in this process), returning the notebook's
results (`icl_heads.results`)."""

from __future__ import annotations

import functools
from typing import Any

from icl_heads.results import AnalysisResult, ExperimentResult
from model_worker import analyze as engine_analyze
from model_worker.experiments import job as engine_experiments


@functools.wraps(engine_analyze.analyze)
def analyze(*args: Any, **kwargs: Any) -> AnalysisResult:
    return AnalysisResult.of(engine_analyze.analyze(*args, **kwargs))


@functools.wraps(engine_experiments.run_experiment)
def run_experiment(*args: Any, **kwargs: Any) -> ExperimentResult:
    return ExperimentResult.of(engine_experiments.run_experiment(*args, **kwargs))
