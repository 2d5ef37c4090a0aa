"""The embedded server: per-request budget (422), queue cap and per-client shares (429), a
result memory bounded in bytes, and results and accepted jobs that outlive the process."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.queue.embedded import EmbeddedBackend
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from tests.integration.test_api_embedded import wait_done
from tests.integration.worker_entry import install_fake_experiment
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama


def settings_for(data_dir: Path, **overrides: Any) -> Settings:
    return Settings(
        model="tiny-llama",
        data_dir=data_dir,
        rate_limit_per_minute=0,
        write_rate_limit_per_minute=0,
        **overrides,
    )


@contextmanager
def serving(settings: Settings, peer: str = "10.0.0.1") -> Iterator[TestClient]:
    backend = embedded_backend(settings, loader=tiny_llama)
    with TestClient(create_app(settings, backend), client=(peer, 50000)) as client:
        yield client


@contextmanager
def busy(client: TestClient) -> Iterator[None]:
    """The worker thread held by another job, so that submissions stay queued."""
    release = threading.Event()
    backend: EmbeddedBackend = client.app.state.backend  # type: ignore[attr-defined]
    backend._model.result(timeout=60)
    backend._executor.submit(release.wait, 60)
    try:
        yield
    finally:
        release.set()


def body(n: int, **options: Any) -> dict[str, Any]:
    return {"prompt": f"cat{n} : foo dog : bar cat{n} :", **options}


def test_an_over_budget_analysis_is_422_naming_the_knob(tmp_path: Path) -> None:
    with serving(settings_for(tmp_path, max_analysis_cost=2_000, max_experiment_n=10)) as client:
        refused = client.post("/api/analyses", json=body(0, top_k_heads=12, top_k_tokens=20))
        assert refused.status_code == 422
        detail = refused.json()["detail"]
        assert "ICL_MAX_ANALYSIS_COST" in detail and "lower top_k_heads to" in detail
        assert client.post("/api/analyses", json=body(0, top_k_heads=2)).status_code == 202
        experiment = {"name": "heads", "dataset": "sentiment-number", "n": 11}
        too_many = client.post("/api/experiments", json=experiment)
        assert too_many.status_code == 422 and "lower n" in too_many.json()["detail"]


def test_the_queue_is_capped(tmp_path: Path) -> None:
    with (
        serving(settings_for(tmp_path, queue_cap=3, client_queued_jobs=50)) as client,
        busy(client),
    ):
        for n in range(3):
            assert client.post("/api/analyses", json=body(n)).status_code == 202
        full = client.post("/api/analyses", json=body(3))
        assert full.status_code == 429 and full.headers["Retry-After"]
        assert "queue is full" in full.json()["detail"]


def test_one_client_gets_only_its_share_of_the_queue(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, client_queued_jobs=2)
    with serving(settings) as greedy, busy(greedy):
        assert [greedy.post("/api/analyses", json=body(n)).status_code for n in range(2)] == [
            202,
            202,
        ]
        refused = greedy.post("/api/analyses", json=body(2))
        assert refused.status_code == 429 and refused.headers["Retry-After"]
        assert "ICL_CLIENT_QUEUED_JOBS" in refused.json()["detail"]
        # another client (another address) of the same server still gets in
        other = TestClient(greedy.app, client=("10.0.0.2", 50000))
        assert other.post("/api/analyses", json=body(2)).status_code == 202


def test_results_in_memory_are_bounded_in_bytes_and_read_back_from_the_store(
    tmp_path: Path,
) -> None:
    settings = settings_for(tmp_path, result_memory_bytes=250_000)
    with serving(settings) as client:
        backend: EmbeddedBackend = client.app.state.backend  # type: ignore[attr-defined]
        ids = [client.post("/api/analyses", json=body(n)).json()["id"] for n in range(6)]
        answers = [wait_done(client, job_id) for job_id in ids]
        assert all(a["status"] == "done" for a in answers)
        assert 0 < backend._memory.bytes <= 250_000
        assert backend._memory.get(ids[0]) is None  # evicted ...
        assert client.get(f"/api/analyses/{ids[0]}").json() == answers[0]  # ... not lost
        assert client.get(f"/a/{ids[0]}/panels/top-heads").status_code == 200


def test_a_restart_keeps_results_and_computes_accepted_jobs(tmp_path: Path) -> None:
    """Process 1 answers one analysis and accepts another, then stops. Process 2 (same data
    directory) serves the first from the store and computes the second when it is polled."""
    settings = settings_for(tmp_path)
    with serving(settings) as first:
        done_id = first.post("/api/analyses", json={"prompt": EXAMPLE_PROMPT}).json()["id"]
        done = wait_done(first, done_id)
        with busy(first):
            accepted = first.post("/api/analyses", json=body(7))
            assert accepted.status_code == 202
            first.app.state.backend._executor.shutdown(wait=False, cancel_futures=True)  # type: ignore[attr-defined]
    with serving(settings) as second:
        assert second.get(f"/api/analyses/{done_id}").json() == done
        page = second.get(f"/a/{done_id}")
        assert page.status_code == 200 and "L0H0" in page.text
        started = time.monotonic()
        lost = wait_done(second, accepted.json()["id"])
        assert lost["status"] == "done" and lost["result"]["prompt"] == body(7)["prompt"]
        assert time.monotonic() - started < 60


def test_an_experiment_permalink_outlives_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "model_worker.experiments.job", None)
    install_fake_experiment()
    settings = settings_for(tmp_path)
    experiment = {"name": "accuracy", "dataset": "sentiment-number", "n": 4}
    with serving(settings) as first:
        job_id = first.post("/api/experiments", json=experiment).json()["id"]
        done = wait_done(first, job_id)
        assert done["status"] == "done"
    with serving(settings) as second:
        assert second.get(f"/api/analyses/{job_id}").json() == done
        page = second.get(f"/e/{job_id}")
        assert page.status_code == 200 and "accuracy" in page.text
        assert second.get(f"/e/{job_id}/download/report.md").status_code == 200


def test_a_client_with_nothing_queued_goes_ahead_of_a_backlog(tmp_path: Path) -> None:
    with serving(settings_for(tmp_path)) as bulk, busy(bulk):
        positions = [bulk.post("/api/analyses", json=body(n)).json() for n in range(4)]
        assert [p["position_in_queue"] for p in positions] == [0, 1, 2, 3]
        first = TestClient(bulk.app, client=("10.0.0.2", 50000))
        second = TestClient(bulk.app, client=("10.0.0.3", 50000))
        # behind only the bulk client's first job (it was alone when it came)
        assert first.post("/api/analyses", json=body(8)).json()["position_in_queue"] == 1
        assert second.post("/api/analyses", json=body(9)).json()["position_in_queue"] == 2
        assert first.post("/api/analyses", json=body(10)).json()["position_in_queue"] == 6
