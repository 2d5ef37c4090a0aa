"""A study on a lab server (real Redis, the real worker code in burst mode, experiments
replaced by tests.integration.worker_entry's fake): its jobs go through the queue within the
client's share of batch work, the upkeep submits the next one when room frees up (no reader
needed), the document is served once all are done; a cancel takes its queued jobs off the
queue (issue 40)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from icl_heads.results_doc import TITLES
from icl_heads.study import study_document
from model_worker.service.queue.keys import result_key
from tests.integration.burst_worker import BurstWorker, burst_worker
from tests.integration.redis_support import private_db, save_tiny_model, web_settings

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]
STUDY = {"experiments": ["accuracy", "attention"], "n": 8}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, BurstWorker]]:
    model = save_tiny_model(tmp_path_factory.mktemp("study-redis") / "tiny-llama")
    with private_db() as url, burst_worker(model, url) as worker:
        yield model, url, worker


def web(lab: tuple[Path, str, BurstWorker], **overrides: Any) -> TestClient:
    model, url, worker = lab
    worker.beat()
    app = create_app(web_settings(model, url, **overrides), study_document=study_document)
    return TestClient(app)


def test_a_study_goes_through_the_queue_within_the_share(
    lab: tuple[Path, str, BurstWorker],
) -> None:
    worker = lab[2]
    with web(lab, client_experiments=1) as client:
        answer = client.post("/api/studies", json=STUDY)
        assert answer.status_code == 202, answer.text
        study = answer.json()
        assert study["jobs"][0]["status"] == "queued" and study["jobs"][1]["id"] is None
        worker.drain()  # the first experiment
        studies = client.app.state.studies  # type: ignore[attr-defined]
        client.portal.call(studies.advance_all)  # type: ignore[union-attr]  (the upkeep pass)
        store = client.app.state.backend.store  # type: ignore[attr-defined]
        assert store.study(study["id"]).jobs[1] is not None  # submitted by the upkeep
        halfway = client.get(f"/api/studies/{study['id']}").json()
        assert halfway["status"] == "running" and halfway["progress"] == 0.5, halfway
        assert client.get(f"/api/studies/{study['id']}/results.md").status_code == 409
        worker.drain()  # the second
        done = client.get(f"/api/studies/{study['id']}").json()
        assert done["status"] == "done" and done["progress"] == 1.0, done
        document = client.get(done["document"])
        assert document.status_code == 200
        assert TITLES["accuracy"] in document.text and TITLES["attention"] in document.text


def test_cancelling_a_study_takes_its_jobs_off_the_queue(
    lab: tuple[Path, str, BurstWorker],
) -> None:
    worker = lab[2]
    with web(lab) as client:
        study = client.post("/api/studies", json={**STUDY, "seeds": [4, 5]}).json()
        jobs = [job["id"] for job in study["jobs"]]
        assert all(jobs)  # the share (2) holds both
        answer = client.delete(f"/api/jobs/{study['id']}")
        assert answer.status_code == 200 and answer.json()["error"] == "cancelled by its submitter"
        for job in jobs:
            state = client.get(f"/api/analyses/{job}").json()
            assert state["status"] == "failed" and state["error"] == "cancelled by its submitter"
        worker.drain()
        assert not any(worker.connection.exists(result_key(job)) for job in jobs)
        ended = client.get(f"/api/studies/{study['id']}").json()
        assert ended["status"] == "failed" and ended["error"] == "cancelled by its submitter"
