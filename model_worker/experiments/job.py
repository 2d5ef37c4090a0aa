"""`run_experiment`: the one entry point the CLI, the embedded backend and the workers call."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

from model_worker.checks.result_warnings import sample_warnings
from model_worker.common.defaults import DEFAULT_MAX_PROMPT_TOKENS
from model_worker.contracts.experiments import EXPERIMENTS, ExperimentRequest, ExperimentResult
from model_worker.contracts.report import Note
from model_worker.experiments.context import Context
from model_worker.experiments.data import ExperimentInputError, resolve_dataset
from model_worker.experiments.progress import Heartbeat, ProgressFn, Stages, no_progress
from model_worker.experiments.seeds import combine_seeds
from model_worker.experiments.slices import Slicer, slicing
from model_worker.experiments.stats import Interval
from model_worker.model.loading import LoadedModel

DEFAULT_BATCH_SIZE = 16


def _runner(name: str) -> Callable[[Context], ExperimentResult]:
    """The `run` of experiment `name`'s runner module (EXPERIMENTS names it)."""
    module = importlib.import_module(f"model_worker.experiments.{EXPERIMENTS[name].runner}")
    runner: Callable[[Context], ExperimentResult] = module.run
    return runner


def run_experiment(
    loaded: LoadedModel,
    request: ExperimentRequest,
    progress: ProgressFn = no_progress,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    slicer: Slicer | None = None,
) -> ExperimentResult:
    """Run experiment `request.name` on `loaded`; `progress(fraction, message)` as it goes;
    every prompt within `max_tokens` tokens (and the model's context); its passes' slices
    through `slicer` (model_worker.experiments.slices; None: computed here in order). A request
    with `seeds` runs once per seed, pooled (`run_seeds`).

    Raises ExperimentInputError (a UserInputError: one clear line) for a bad dataset or request.
    """
    if request.seeds:
        return run_seeds(
            loaded,
            request,
            request.seeds,
            progress,
            batch_size=batch_size,
            max_tokens=max_tokens,
            slicer=slicer,
        )
    return run_keeping(
        loaded, request, progress, batch_size=batch_size, max_tokens=max_tokens, slicer=slicer
    )[0]


def run_seeds(
    loaded: LoadedModel,
    request: ExperimentRequest,
    seeds: Sequence[int],
    progress: ProgressFn = no_progress,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    slicer: Slicer | None = None,
) -> ExperimentResult:
    """`request` run once per seed, pooled into one result (model_worker.experiments.seeds).
    Progress is one monotone fraction over every seed (each an equal span), its messages
    naming the seed and the pass: `seed 2 of 3 · pass 1 of 4: …` (a seed's passes are counted
    once the first seed has run them all)."""
    sliced = slicer or Slicer()
    spans = Stages(progress, {f"seed {i + 1}": 1.0 for i in range(len(seeds))})
    runs: list[tuple[ExperimentResult, dict[str, Interval]]] = []
    per_seed: int | None = None
    for i, seed in enumerate(seeds):
        span = spans.stage(f"seed {i + 1}")

        def report(fraction: float, message: str, span: ProgressFn = span, i: int = i) -> None:
            span(fraction, f"seed {i + 1} of {len(seeds)} · {message}")

        before = sliced.passes
        single = request.model_copy(update={"seed": seed, "seeds": []})
        runs.append(
            run_keeping(
                loaded,
                single,
                report,
                batch_size=batch_size,
                max_tokens=max_tokens,
                slicer=sliced,
                passes_of=per_seed,
            )
        )
        per_seed = per_seed or sliced.passes - before
    spans.done()
    return combine_seeds([r for r, _ in runs], [k for _, k in runs])


def run_keeping(
    loaded: LoadedModel,
    request: ExperimentRequest,
    progress: ProgressFn = no_progress,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    slicer: Slicer | None = None,
    passes_of: int | None = None,
) -> tuple[ExperimentResult, dict[str, Interval]]:
    """`run_experiment` of one seed, and the run's intervals with what they were computed
    from; its messages number its own passes (`pass 2 of 5` when `passes_of` says how many)."""
    if batch_size < 1:
        raise ExperimentInputError(f"batch size must be at least 1, got {batch_size}")
    if request.name not in EXPERIMENTS:
        raise ExperimentInputError(f"unknown experiment {request.name!r}")
    dataset = resolve_dataset(request)
    sliced = slicer or Slicer()
    before = sliced.passes

    def named(fraction: float, message: str) -> None:
        """Each report names the pass it comes from (`pass 3: random: prompts 64/200`)."""
        number = sliced.passes - before
        if number and passes_of and number <= passes_of:
            message = f"pass {number} of {passes_of}: {message}"
        elif number:
            message = f"pass {number}: {message}"
        progress(fraction, message)

    with (
        slicing(sliced),
        Heartbeat(named) as beating,  # a report at least every second, even mid-batch
    ):
        ctx = Context(loaded, request, dataset, batch_size, beating, max_tokens)
        result = with_sample_caveat(_runner(request.name)(ctx))
        progress(1.0, "done")
    return result, ctx.kept


def with_sample_caveat(result: ExperimentResult) -> ExperimentResult:
    """`result` with the `small_sample` warning, also atop its report, when its n is below
    checks.MIN_PROMPTS: no sd, percentage or ρ from so few prompts without saying so."""
    caveats = sample_warnings(result.n)
    if not caveats:
        return result
    notes = [Note(text=f"Caveat: {caveat.message}") for caveat in caveats]
    return result.model_copy(
        update={"warnings": [*result.warnings, *caveats], "report": [*notes, *result.report]}
    )
