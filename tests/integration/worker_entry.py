"""A real `icl-heads worker` for the Redis tests, with test-only hooks set by env variables
(tests.integration.burst_worker installs the same hooks in the test process).

Run as `python -m tests.integration.worker_entry worker --model DIR ...`. Hooks:
- TEST_JOB_DELAY_S: sleep this long inside every analysis (time to kill a worker mid-job);
- prompts containing `oom` raise torch.cuda.OutOfMemoryError (a GPU running out of memory);
- prompts containing `details-later` wait DETAILS_LATER_S between the per-head stage and the
  head details;
- `model_worker.experiments.job.run_experiment` is replaced by `fake_run_experiment`, unless
  TEST_REAL_EXPERIMENTS is set; TEST_SLICE_DELAY_S: sleep this long in every slice of a real
  experiment's passes (time to submit, kill or cancel mid-experiment).
"""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Callable

from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest, AnalysisResult
from model_worker.contracts.experiments import ExperimentRequest, ExperimentResult
from model_worker.experiments.slices import Slicer
from model_worker.model.loading import LoadedModel

FAKE_STEPS = 5
RunAnalysis = Callable[..., AnalysisResult]
DETAILS_LATER_S = 1.5


def fake_run_experiment(
    loaded: LoadedModel,
    request: ExperimentRequest,
    progress: Callable[[float, str], None],
    *,
    max_tokens: int,
    slicer: Slicer | None = None,
) -> ExperimentResult:
    """Reports FAKE_STEPS progress steps, 0.3 s apart, then a result counting them (the
    worker's prompt limit, `max_tokens`, is required: every caller passes it); each step is a
    slice of `slicer` (the embedded worker runs waiting jobs, or stops a cancelled one, there)."""
    for step in range(FAKE_STEPS):
        if slicer is not None:
            slicer.checkpoint()
        progress(step / FAKE_STEPS, f"step {step + 1} of {FAKE_STEPS}")
        time.sleep(0.3)
    progress(1.0, "done")
    return ExperimentResult(
        name=request.name,
        model=loaded.name,
        dataset=request.dataset,
        n=request.n,
        seed=request.seed,
        # the design options as the worker got them (`--server` sends them all)
        metrics={
            "steps": float(FAKE_STEPS),
            "seeds": float(len(request.seeds)),
            "demos_per_label": float(request.demos_per_label),
            "meaningful": float(request.labels == "meaningful"),
            "fftt": float(request.design == "fftt"),
        },
        tables={},
        figures={},
        report_markdown="",
    )


def fake_experiment_module() -> types.ModuleType:
    """What `from model_worker.experiments.job import run_experiment` gives under the hooks."""
    module = types.ModuleType("model_worker.experiments.job")
    module.run_experiment = fake_run_experiment  # type: ignore[attr-defined]
    return module


def hooked_run_analysis(delay_s: float) -> RunAnalysis:
    """`model_worker.service.jobs.run_analysis` with the hooks above (`delay_s`:
    TEST_JOB_DELAY_S)."""
    import torch

    from model_worker.service import jobs

    real = jobs.run_analysis

    def run_analysis(
        loaded: LoadedModel,
        request: AnalysisRequest,
        on_heads: Callable[[AnalysisResult], None] | None = None,
        *,
        settings: Settings,
    ) -> AnalysisResult:
        if "oom" in request.prompt:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        time.sleep(delay_s)

        def heads_then_wait(partial: AnalysisResult) -> None:
            if on_heads is not None:
                on_heads(partial)
            if "details-later" in request.prompt:
                time.sleep(DETAILS_LATER_S)

        return real(loaded, request, heads_then_wait, settings=settings)

    return run_analysis


def install_fake_experiment() -> None:
    """Make `from model_worker.experiments.job import run_experiment` give the fake."""
    sys.modules["model_worker.experiments.job"] = fake_experiment_module()


def _install_hooks() -> None:
    from model_worker.service import jobs

    jobs.run_analysis = hooked_run_analysis(float(os.environ.get("TEST_JOB_DELAY_S", "0")))
    if not os.environ.get("TEST_REAL_EXPERIMENTS"):
        install_fake_experiment()
    slow_slices(float(os.environ.get("TEST_SLICE_DELAY_S", "0")))


def slow_slices(delay_s: float) -> None:
    """Every slice of an experiment's passes takes `delay_s` longer."""
    if not delay_s:
        return
    from model_worker.experiments import batching

    real = batching._run_part

    def slow_part(*args: object, **kwargs: object) -> object:
        time.sleep(delay_s)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    batching._run_part = slow_part  # type: ignore[assignment]


if __name__ == "__main__":
    _install_hooks()
    from icl_heads.cli import app

    app(prog_name="icl-heads")
