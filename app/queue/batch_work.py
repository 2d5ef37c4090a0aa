"""Batch work: experiments and activation patching, jobs of minutes to hours that share one
per-client share (`ICL_CLIENT_EXPERIMENTS`), apart from the analyses' (`ICL_CLIENT_QUEUED_JOBS`);
the price of a patching job at submission, with the workers' published geometry and
tokenizer (model_worker.checks.budget; the worker checks it again); and what a patch adding
heads to a finished one reuses of it (model_worker.checks.patch_reuse)."""

from __future__ import annotations

from app.queue.interface import BackendError
from model_worker.checks.budget import BudgetError, check_patch
from model_worker.checks.patch_reuse import added_heads
from model_worker.contracts.patching import PatchingResult, PatchRequest
from model_worker.service.queue.heartbeats import WorkerBeat
from model_worker.service.queue.keys import is_experiment, is_patching, patching_job_id


def is_batch(job_id: str) -> bool:
    """Whether `job_id` counts against the batch-work share (experiments, patching)."""
    return is_experiment(job_id) or is_patching(job_id)


def reused(
    base: PatchingResult | None,
    base_id: str,
    request: PatchRequest,
    model: str,
    fingerprint: str,
) -> tuple[PatchingResult, list[str]] | None:
    """The finished patch `base` (job `base_id`) and the heads `request` adds to it, when it is
    the same patch apart from those heads and was computed by `model` with this `fingerprint`
    (its id is its request's content hash); else None (`request` is patched whole)."""
    if base is None or base.request is None:
        return None
    if patching_job_id(model, fingerprint, base.request) != base_id:
        return None
    added = added_heads(base, request)
    return None if added is None else (base, added)


def price_patch(
    request: PatchRequest,
    beats: list[WorkerBeat],
    n_tokens: int | None,
    limit: int,
    added: int | None = None,
) -> None:
    """422 naming the knobs to lower when patching `request` costs more than `limit` forward
    passes × tokens on the workers' model (unknown geometry or tokens: the worker checks);
    `added`: only that many heads added to a finished patch are priced."""
    sizes = [(beat.n_layers, beat.n_heads) for beat in beats if beat.n_layers and beat.n_heads]
    if n_tokens is None or not sizes:
        return
    n_layers, n_heads = max(sizes)
    try:
        check_patch(request, n_tokens, n_layers, n_heads, limit, added)
    except BudgetError as exc:
        raise BackendError(str(exc), status=422) from exc
