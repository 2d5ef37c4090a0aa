"""The local library calls (torch and the model in this process), returning the notebook's
results (`icl_heads.results`)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from icl_heads.results import AnalysisResult, ExperimentResult
from model_worker.contracts import analysis as contracts
from model_worker.experiments import job as engine_experiments
from model_worker.model import loading
from model_worker.run import analyze as engine_analyze
from model_worker.run import more_heads


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' and the hub's progress bars off for the block (a notebook without
    ipywidgets prints "IProgress not found" for each), as they were after it."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )
    from transformers.utils import logging as hf_logging

    hub_was_off, hf_was_on = are_progress_bars_disabled(), hf_logging.is_progress_bar_enabled()
    disable_progress_bars()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not hub_was_off:
            enable_progress_bars()
        if hf_was_on:
            hf_logging.enable_progress_bar()


@functools.wraps(loading.load_model)
def load_model(*args: Any, **kwargs: Any) -> loading.LoadedModel:
    with no_progress_bars():
        return loading.load_model(*args, **kwargs)


@functools.wraps(engine_analyze.analyze)
def analyze(*args: Any, **kwargs: Any) -> AnalysisResult:
    result = AnalysisResult.of(engine_analyze.analyze(*args, **kwargs))
    if kwargs.get("label_keys") != "all":  # a head's label keys: computed when it is opened
        asked = inspect.signature(engine_analyze.analyze).bind(*args, **kwargs).arguments
        loaded, k = asked["loaded"], asked.get("top_k_tokens", 10)

        def complete(name: str) -> contracts.HeadDetail:
            """Its label-key tables from one forward pass of the prompt (not an analysis)."""
            return more_heads.with_label_keys(loaded, result, name, k)

        result._complete = complete
    return result


@functools.wraps(engine_experiments.run_experiment)
def run_experiment(*args: Any, **kwargs: Any) -> ExperimentResult:
    return ExperimentResult.of(engine_experiments.run_experiment(*args, **kwargs))
