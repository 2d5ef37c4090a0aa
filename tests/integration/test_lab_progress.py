"""Honest progress on a lab server (issue 40.4): real Redis, a real worker process, a chunked
multi-seed experiment. Its progress read through the API is one monotone fraction across
chunks, seeds and passes, and the estimate of the time left, once the first chunk is done, is
within 2× of the time it really took."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from redis import Redis
from rq.job import Job

from app.main import create_app
from app.queue.redis_backend import RedisBackend
from model_worker.contracts.experiments import ExperimentRequest
from model_worker.service.queue.reaper import fetch_job
from tests.integration.conftest import MODEL
from tests.integration.redis_support import (
    private_db,
    save_tiny_model,
    serving_workers,
    web_settings,
)

pytestmark = [pytest.mark.redis, pytest.mark.timeout(600)]
SLICE_DELAY_S = 0.4
CHUNK_S = 4.0
WORDS = {"sentiment": ["love", "like", "hate", "good", "bad"], "number": ["one", "two", "four"]}
TINY_CSV = "text,label\n" + "".join(f"{w},{c}\n" for c, ws in WORDS.items() for w in ws)


@pytest.mark.slow
def test_progress_through_the_api_is_monotone_and_the_estimate_within_twice_the_truth(
    tmp_path: Path,
) -> None:
    model = save_tiny_model(tmp_path / "tiny-llama")
    env = {
        "TEST_REAL_EXPERIMENTS": "1",
        "TEST_SLICE_DELAY_S": str(SLICE_DELAY_S),
        "ICL_EXPERIMENT_CHUNK_S": str(CHUNK_S),
        "ICL_WARM_UP": "0",
    }
    request = ExperimentRequest(
        name="ablation",
        dataset="upload",
        n=32,
        seeds=[0, 1],
        dataset_text=TINY_CSV,
        dataset_filename="tiny.csv",
    )
    with (
        private_db() as url,
        serving_workers(model, url, tmp_path, env=env, start_timeout=400),
        TestClient(create_app(web_settings(model, url))) as client,
    ):
        job_id = client.post("/api/experiments", json=request.model_dump()).json()["id"]
        redis = Redis.from_url(url)
        first_chunk_ended: float | None = None  # when RQ first queued the job again
        seen: list[tuple[float, str, float | None, float | None, str]] = []
        deadline = time.monotonic() + 400
        while (body := client.get(f"/api/analyses/{job_id}").json())["status"] not in (
            "done",
            "failed",
        ):
            seen.append(
                (
                    time.monotonic(),
                    body["status"],
                    body["progress"],
                    body["eta_s"],
                    body["message"] or "",
                )
            )
            assert time.monotonic() < deadline, body
            if first_chunk_ended is None and redis.hget(Job.key_for(job_id), "number_of_retries"):
                first_chunk_ended = time.monotonic()
            time.sleep(0.05)
        ended = time.monotonic()
    assert body["status"] == "done", body
    assert body["experiment"]["seeds"] == [0, 1]
    fractions = [progress for _, _, progress, _, _ in seen if progress is not None]
    assert fractions == sorted(fractions) and len(set(fractions)) > 10, fractions
    messages = [message for *_, message in seen]
    assert any(m.startswith("seed 2 of 2 · pass ") for m in messages), messages
    for seed in ("seed 1 of 2 · pass ", "seed 2 of 2 · pass "):  # every chunk numbers alike
        numbers = [
            int(m[len(seed) :].split(":")[0].split(" ")[0]) for m in messages if m.startswith(seed)
        ]
        assert numbers == sorted(numbers), (seed, numbers)
    # the first chunk ends when the job is first queued again (its estimate while paused
    # between two chunks is still the time left, not the wait for its next chunk)
    assert first_chunk_ended is not None, "the experiment ran in one chunk"
    paused = [first_chunk_ended]
    estimates = [
        (at, eta)
        for at, _, progress, eta, _ in seen
        if at >= paused[0] and eta is not None and progress is not None and progress < 0.9
    ]
    assert len(estimates) > 5, seen
    for at, eta in estimates:
        real = ended - at
        if real > 2.0:  # (in the last seconds, scheduling noise dominates any ratio)
            assert real / 2 <= eta <= real * 2, (eta, real)


def test_an_experiment_between_two_chunks_reports_the_time_it_has_left(
    backend: RedisBackend,
) -> None:
    """Queued again for its next chunk, an experiment's estimate is still the time it has
    left at its rate (as its last chunk wrote it), not the wait for a worker."""
    request = ExperimentRequest(name="accuracy", dataset="sentiment-number", model=MODEL, n=8)
    job_id = backend._submit(request, "client").id
    job = fetch_job(job_id, backend._redis)
    job.meta |= {"progress": 0.4, "eta_s": 12.0, "message": "pass 3: prompts: 8/8"}
    job.save_meta()
    state = backend._status(job_id)
    assert state is not None and state.status == "queued" and state.progress == 0.4
    assert state.eta_s == 12.0 and "paused between chunks" in (state.message or "")
