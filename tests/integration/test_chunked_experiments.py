"""Experiments on a lab server (real Redis, two worker processes): chunks over every worker of
the model, merged into the one-worker result; interactive jobs between chunks; a worker killed
mid-chunk costs that chunk only; cancel frees the worker and keeps nothing (issue 40)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from app.main import create_app
from model_worker.contracts.experiments import ExperimentRequest
from model_worker.experiments.job import run_experiment
from model_worker.experiments.slices import Slicer
from model_worker.model.loading import load_model
from model_worker.service.queue.keys import (
    SLICES_BY_WORKER_KEY,
    SLICES_STORED_KEY,
    result_key,
    slices_key,
)
from tests.integration.redis_support import (
    private_db,
    save_tiny_model,
    serving_workers,
    web_settings,
)
from tests.tiny_models import EXAMPLE_PROMPT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
SLICE_DELAY_S = 0.2
CHUNK_S = 5.0
WORKERS_ENV = {
    "TEST_REAL_EXPERIMENTS": "1",
    "TEST_SLICE_DELAY_S": str(SLICE_DELAY_S),
    "ICL_EXPERIMENT_CHUNK_S": str(CHUNK_S),
    "ICL_WARM_UP": "0",
}
WORDS = {"sentiment": ["love", "like", "hate", "good", "bad"], "number": ["one", "two", "four"]}
TINY_CSV = "text,label\n" + "".join(f"{w},{c}\n" for c, ws in WORDS.items() for w in ws)


def experiment(seed: int = 3, n: int = 64) -> ExperimentRequest:
    return ExperimentRequest(
        name="ablation",
        dataset="upload",
        n=n,
        seed=seed,
        dataset_text=TINY_CSV,
        dataset_filename="tiny.csv",
    )


class Lab:
    def __init__(self, model: Path, url: str, client: TestClient, workers: list[Any]) -> None:
        self.model, self.url, self.client, self.workers = model, url, client, workers
        self.redis = Redis.from_url(url)

    def submit(self, request: ExperimentRequest) -> str:
        response = self.client.post("/api/experiments", json=request.model_dump())
        assert response.status_code in (200, 202), response.text
        job_id: str = response.json()["id"]
        return job_id

    def state(self, job_id: str) -> dict[str, Any]:
        body: dict[str, Any] = self.client.get(f"/api/analyses/{job_id}").json()
        return body

    def wait(self, job_id: str, until: tuple[str, ...], timeout: float = 600) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            body = self.state(job_id)
            if body["status"] in until:
                return body
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} not {until} within {timeout} s")

    def wait_for(self, predicate: Any, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)

    def alone(self, request: ExperimentRequest) -> dict[str, Any]:
        """The experiment's result computed here, on one worker (this process)."""
        loaded = load_model(str(self.model), device="cpu", dtype="float32")
        return run_experiment(loaded, request).model_dump(mode="json")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture()
def lab(model: Path, tmp_path: Path) -> Iterator[Lab]:
    with (
        private_db() as url,
        serving_workers(
            model, url, tmp_path, count=2, env=WORKERS_ENV, start_timeout=400
        ) as workers,
        TestClient(create_app(web_settings(model, url))) as client,
    ):
        yield Lab(model, url, client, workers)


def slices_of(request: ExperimentRequest, model: Path) -> int:
    """How many slices the experiment's passes hold (counted on one worker)."""
    counted = []

    class Counting(Slicer):
        def run(self, digest: str, n_slices: int, *args: Any, **kwargs: Any) -> Any:
            counted.append(n_slices)
            return super().run(digest, n_slices, *args, **kwargs)

    loaded = load_model(str(model), device="cpu", dtype="float32")
    run_experiment(loaded, request, slicer=Counting())
    return sum(counted)


def test_two_workers_share_the_chunks_and_merge_to_the_one_worker_result(lab: Lab) -> None:
    request = experiment()
    job_id = lab.submit(request)
    done = lab.wait(job_id, ("done", "failed"))
    assert done["status"] == "done", done
    assert done["experiment"] == lab.alone(request)
    by_worker = {k.decode(): int(v) for k, v in lab.redis.hgetall(SLICES_BY_WORKER_KEY).items()}
    assert len(by_worker) == 2 and min(by_worker.values()) > 0, by_worker
    assert int(lab.redis.get(SLICES_STORED_KEY) or 0) == slices_of(request, lab.model)
    assert not lab.redis.exists(slices_key(job_id))  # the slices went with the merge


def test_an_analysis_starts_within_one_chunk_while_two_experiments_run(lab: Lab) -> None:
    first, second = lab.submit(experiment(seed=1, n=128)), lab.submit(experiment(seed=2, n=128))
    for job_id in (first, second):  # past their first slices (a worker's first kernel choices)
        lab.wait_for(lambda job_id=job_id: (lab.state(job_id)["progress"] or 0) >= 0.1)
    submitted = time.monotonic()
    job = lab.client.post("/api/analyses", json={"prompt": EXAMPLE_PROMPT, "target": "foo"})
    analysis = job.json()["id"]
    started = lab.wait(analysis, ("running", "done", "failed"))
    waited = time.monotonic() - submitted
    assert waited <= CHUNK_S, waited  # within one chunk (it ends at once for an analysis)
    assert started["status"] != "failed"
    assert lab.state(first)["status"] != "done" or lab.state(second)["status"] != "done"
    assert lab.wait(analysis, ("done", "failed"))["status"] == "done"
    for job_id in (first, second):
        assert lab.wait(job_id, ("done", "failed"))["status"] == "done"


def test_cancel_frees_the_worker_and_keeps_nothing(lab: Lab) -> None:
    job_id = lab.submit(experiment(seed=4, n=128))
    lab.wait(job_id, ("running",))
    time.sleep(1.0)
    answer = lab.client.delete(f"/api/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    asked = time.monotonic()
    ended = lab.wait(job_id, ("done", "failed"))
    assert time.monotonic() - asked <= CHUNK_S + 2 * SLICE_DELAY_S + 1.0
    assert ended["status"] == "failed" and ended["error"] == "cancelled by its submitter"
    analysis = lab.client.post("/api/analyses", json={"prompt": EXAMPLE_PROMPT}).json()["id"]
    assert lab.wait(analysis, ("done", "failed"), timeout=30)["status"] == "done"
    assert not lab.redis.exists(result_key(job_id))
    assert not lab.redis.exists(slices_key(job_id))
    store = lab.client.app.state.backend._store  # type: ignore[attr-defined]
    assert not store.has_result(job_id)
    page = lab.client.get(f"/e/{job_id}")
    assert "was cancelled" in page.text


def test_a_worker_killed_mid_chunk_costs_that_chunk_only(lab: Lab) -> None:
    request = experiment(seed=5, n=128)
    job_id = lab.submit(request)
    lab.wait(job_id, ("running",))
    time.sleep(2.0)  # both workers hold slices of it by now
    lab.workers[0].send_signal(signal.SIGKILL)
    lab.workers[0].wait()
    done = lab.wait(job_id, ("done", "failed"))
    assert done["status"] == "done", done
    assert done["experiment"] == lab.alone(request)
    assert int(lab.redis.get(SLICES_STORED_KEY) or 0) == slices_of(request, lab.model)
