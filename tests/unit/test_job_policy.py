"""The worker's job allow-list (model_worker/service/job_policy.py) against what the web tier
enqueues."""

from __future__ import annotations

from rq import Callback, Queue
from rq.serializers import JSONSerializer

from app.queue.redis_backend import ANALYSIS_FUNC, EXPERIMENT_FUNC, PATCHING_FUNC
from model_worker.service.job_policy import ALLOWED_JOBS, refusal
from model_worker.service.jobs import HELPER_FUNC


class FakeRedis:
    """Enough of a connection for Queue.create_job (which stores nothing)."""


def job(func: str, *args: object, **options: object) -> object:
    queue = Queue("q", connection=FakeRedis(), serializer=JSONSerializer)  # type: ignore[arg-type]
    return queue.create_job(func, args=args, **options)  # type: ignore[arg-type]


def test_the_web_tiers_jobs_are_the_allowed_ones() -> None:
    assert {ANALYSIS_FUNC, EXPERIMENT_FUNC, PATCHING_FUNC, HELPER_FUNC} == ALLOWED_JOBS
    assert refusal(job(HELPER_FUNC, '{"name": "accuracy"}', 60)) is None
    assert refusal(job(ANALYSIS_FUNC, '{"prompt": "a : b c :"}', 60)) is None
    assert refusal(job(EXPERIMENT_FUNC, '{"name": "accuracy"}', 60)) is None
    assert refusal(job(PATCHING_FUNC, '{"prompt": "a : b c : d e :"}', 60)) is None


def test_anything_else_is_refused_with_a_reason() -> None:
    cases = {
        "os.system": job("os.system", "id"),
        "not one of": job("model_worker.service.jobs.serve_model", None),
        "arguments": job(ANALYSIS_FUNC, "{}", "60"),
        "callback": job(ANALYSIS_FUNC, "{}", 60, on_failure=Callback("os.system")),
    }
    for expected, case in cases.items():
        reason = refusal(case)
        assert reason is not None
        if expected != "os.system":
            assert expected in reason, reason
    assert "'os.system' is not one of this project's jobs" in (refusal(cases["os.system"]) or "")


def test_only_a_patch_may_carry_the_patch_it_reuses() -> None:
    """A patch adding heads to a finished one is handed it (id, result JSON, signature): three
    strings, for the patching job alone."""
    handed = ["p-" + "0" * 64, '{"model": "m"}', "ab" * 32]
    assert refusal(job(PATCHING_FUNC, '{"prompt": "a : b c :"}', 60, handed)) is None
    for case in (
        job(ANALYSIS_FUNC, '{"prompt": "a : b c :"}', 60, handed),
        job(PATCHING_FUNC, '{"prompt": "a : b c :"}', 60, [*handed, "x"]),
        job(PATCHING_FUNC, '{"prompt": "a : b c :"}', 60, [handed[0], {"body": 1}, handed[2]]),
        job(PATCHING_FUNC, '{"prompt": "a : b c :"}', 60, handed, "more"),
    ):
        assert "arguments" in (refusal(case) or ""), case
