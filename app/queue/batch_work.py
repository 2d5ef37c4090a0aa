"""Batch work: experiments and activation patching, jobs of minutes to hours that share one
per-client share (`ICL_CLIENT_EXPERIMENTS`), apart from the analyses' (`ICL_CLIENT_QUEUED_JOBS`);
and the price of a patching job at submission, with the workers' published geometry and
tokenizer (model_worker.checks.budget; the worker checks it again)."""

from __future__ import annotations

from app.queue.interface import BackendError
from model_worker.checks.budget import BudgetError, check_patch
from model_worker.contracts.patching import PatchRequest
from model_worker.service.queue.heartbeats import WorkerBeat
from model_worker.service.queue.keys import is_experiment, is_patching


def is_batch(job_id: str) -> bool:
    """Whether `job_id` counts against the batch-work share (experiments, patching)."""
    return is_experiment(job_id) or is_patching(job_id)


def price_patch(
    request: PatchRequest, beats: list[WorkerBeat], n_tokens: int | None, limit: int
) -> None:
    """422 naming the knobs to lower when patching `request` costs more than `limit` forward
    passes × tokens on the workers' model (unknown geometry or tokens: the worker checks)."""
    sizes = [(beat.n_layers, beat.n_heads) for beat in beats if beat.n_layers and beat.n_heads]
    if n_tokens is None or not sizes:
        return
    n_layers, n_heads = max(sizes)
    try:
        check_patch(request, n_tokens, n_layers, n_heads, limit)
    except BudgetError as exc:
        raise BackendError(str(exc), status=422) from exc
