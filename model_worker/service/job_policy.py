"""Which RQ jobs a worker runs: only this project's job functions, called as the web tier calls
them. RQ imports whatever function (and callback) a job names, so anyone able to write to Redis
could otherwise run any importable function as the worker's user.

A refused job never reaches an import: `refusal` reads only the job's stored data (JSON).
"""

from __future__ import annotations

from typing import Any

from model_worker.service import jobs

#: Dotted names of the only functions a worker runs (what the web tier enqueues).
ALLOWED_JOBS = frozenset(
    f"{function.__module__}.{function.__qualname__}"
    for function in (
        jobs.analysis_job,
        jobs.experiment_job,
        jobs.experiment_helper_job,
        jobs.patching_job,
    )
)
#: Longest job-function name quoted back in a refusal.
MAX_SHOWN = 120


def _shown(name: object) -> str:
    text = repr(name)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "…"


def _extras(job: Any) -> list[str]:
    """What else the job asks RQ to run or call: callbacks and webhooks."""
    stored = job.to_dict(include_meta=False, include_result=False)  # names, never imports
    extras = [
        f"a {kind} callback"
        for kind in ("success", "failure", "stopped")
        if stored.get(f"{kind}_callback_name")
    ]
    if getattr(job, "webhooks", None):
        extras.append("webhooks")
    return extras


def _arguments_fit(name: str, args: Any) -> bool:
    """(request JSON, TTL), and for a patch that adds heads to a finished one the reused
    patch (three strings: its id, result JSON and signature, jobs.Reuse)."""
    if not isinstance(args, list | tuple) or len(args) not in (2, 3):
        return False
    if not isinstance(args[0], str) or type(args[1]) is not int:
        return False
    if len(args) == 2:
        return True
    handed = args[2]
    patching = name == f"{jobs.patching_job.__module__}.{jobs.patching_job.__qualname__}"
    return (
        patching
        and isinstance(handed, list)
        and len(handed) == 3
        and all(isinstance(item, str) for item in handed)
    )


def refusal(job: Any) -> str | None:
    """Why this worker refuses `job` (an rq Job), or None when it is one of ours as enqueued:
    an allowed function, no bound instance, (request JSON, TTL) arguments (a patch: maybe
    the patch it reuses, jobs.Reuse), no callbacks."""
    try:
        name, instance, args, kwargs = job.func_name, job.instance, job.args, job.kwargs
    except Exception as exc:  # undecodable data: nothing of it may run
        return f"unreadable job data ({type(exc).__name__})"
    if name not in ALLOWED_JOBS:
        return f"job function {_shown(name)} is not one of this project's jobs"
    if instance is not None:
        return "a job bound to an object instance"
    if kwargs or not _arguments_fit(name, args):
        return "unexpected job arguments"
    extras = _extras(job)
    if extras:
        return f"a job carrying {' and '.join(extras)}"
    return None
