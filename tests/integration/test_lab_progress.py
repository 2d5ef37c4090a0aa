"""Honest progress on a lab server (issue 40.4): real Redis, a real worker process, a chunked
multi-seed experiment. Its progress read through the API is one monotone fraction across
chunks, seeds and passes, and the estimate of the time left, once the first chunk is done, is
within 2× of the time it really took."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from model_worker.contracts.experiments import ExperimentRequest
from tests.integration.redis_support import (
    private_db,
    save_tiny_model,
    serving_workers,
    web_settings,
)

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(600)]
SLICE_DELAY_S = 0.15
CHUNK_S = 1.5
WORDS = {"sentiment": ["love", "like", "hate", "good", "bad"], "number": ["one", "two", "four"]}
TINY_CSV = "text,label\n" + "".join(f"{w},{c}\n" for c, ws in WORDS.items() for w in ws)


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
            time.sleep(0.05)
        ended = time.monotonic()
    assert body["status"] == "done", body
    assert body["experiment"]["seeds"] == [0, 1]
    fractions = [progress for _, _, progress, _, _ in seen if progress is not None]
    assert fractions == sorted(fractions) and len(set(fractions)) > 10, fractions
    messages = [message for *_, message in seen]
    assert any(m.startswith("seed 2 of 2 · pass ") for m in messages), messages
    # the first chunk ends when the job is first queued again, paused between two chunks (its
    # estimate then is still the time left, not the wait for its next chunk)
    paused = [at for at, status, progress, _, _ in seen if status == "queued" and progress]
    assert paused, "the experiment ran in one chunk"
    estimates = [
        (at, eta)
        for at, _, progress, eta, _ in seen
        if at >= paused[0] and eta is not None and progress is not None and progress < 0.9
    ]
    assert len(estimates) > 5, seen
    for at, eta in estimates:
        real = ended - at
        assert real / 2 <= eta <= real * 2, (eta, real)
