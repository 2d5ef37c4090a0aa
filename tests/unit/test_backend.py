"""Backend helpers that need no Redis: the cached-body fast path and error wording."""

from __future__ import annotations

import json

from app.queue.redis_backend import RedisBackend
from model_worker.service.queue.heartbeats import WorkerBeat
from model_worker.service.queue.states import JobState, JobStatus, done_body


def test_done_body_is_a_valid_job_state() -> None:
    body = done_body("e-12", b'{"name": "accuracy"}')
    parsed = json.loads(body)
    assert parsed["experiment"] == {"name": "accuracy"} and parsed["result"] is None
    assert set(parsed) == set(JobState.model_fields)
    assert json.loads(done_body("a-1", b"{}"))["status"] == JobStatus.DONE


def beat(mean: float | None) -> WorkerBeat:
    return WorkerBeat(
        name="w",
        model="m",
        fingerprint="f",
        queue="q",
        device="cpu",
        host="h",
        pid=1,
        started_at=0.0,
        mean_job_s=mean,
    )


def test_retry_after_follows_the_workers_pace() -> None:
    assert RedisBackend._retry_after(10, [beat(None)]) == 5
    assert RedisBackend._retry_after(10, [beat(2.0), beat(2.0)]) == 10
    assert RedisBackend._retry_after(10_000, [beat(60.0)]) == 600
