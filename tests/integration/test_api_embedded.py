"""The JSON API over the embedded backend, with a tiny model."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from model_worker.common.settings import Settings
from model_worker.contracts.experiments import ExperimentRequest
from tests.app_clients import embedded_client
from tests.integration.worker_entry import FAKE_STEPS, install_fake_experiment
from tests.tiny_models import EXAMPLE_PROMPT


@pytest.fixture()
def client() -> Iterator[TestClient]:
    settings = Settings(model="tiny-llama", write_rate_limit_per_minute=0)
    with embedded_client(settings) as test_client:
        yield test_client


def wait_done(client: TestClient, job_id: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"/api/analyses/{job_id}").json()
        if body["status"] in ("done", "failed"):
            return body
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s")


def test_submit_poll_then_cached(client: TestClient) -> None:
    first = client.post("/api/analyses", json={"prompt": EXAMPLE_PROMPT, "target": "foo"})
    assert first.status_code == 202
    body = wait_done(client, first.json()["id"])
    assert body["status"] == "done"
    assert body["result"]["target"]["token"] == "foo"
    again = client.post("/api/analyses", json={"prompt": EXAMPLE_PROMPT, "target": "foo"})
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["result"]["heads"][0]["name"].startswith("L")
    cached = client.get(f"/api/analyses/{body['id']}")
    assert cached.json() == body
    etag = cached.headers["ETag"]
    revalidated = client.get(f"/api/analyses/{body['id']}", headers={"If-None-Match": etag})
    assert revalidated.status_code == 304 and not revalidated.content


def test_empty_prompt_is_refused_at_once(client: TestClient) -> None:
    response = client.post("/api/analyses", json={"prompt": "   "})
    assert response.status_code == 422
    assert "empty" in response.json()["detail"]


def test_labels_missing_from_the_prompt_fail_the_job_with_its_message(client: TestClient) -> None:
    job = client.post("/api/analyses", json={"prompt": EXAMPLE_PROMPT, "labels": ["baz"]}).json()
    body = wait_done(client, job["id"])
    assert body["status"] == "failed"
    assert "'baz' do not occur" in body["error"]
    assert not body["error"].startswith("internal error")


def test_experiment_reports_progress_then_its_result(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "model_worker.experiments.job", None)
        install_fake_experiment()
        backend = client.app.state.backend  # type: ignore[attr-defined]
        request = ExperimentRequest(name="accuracy", dataset="sentiment-number", n=4)
        job = client.portal.call(backend.submit_experiment, request)  # type: ignore[union-attr]
        body = _follow_progress(client, job.id)
    assert job.id.startswith("e-")
    seen, final = body
    assert final["status"] == "done", final
    assert final["experiment"]["metrics"]["steps"] == FAKE_STEPS
    assert final["experiment"]["name"] == "accuracy"
    assert seen and 0 < max(seen) < 1
    assert seen == sorted(seen)


def _follow_progress(client: TestClient, job_id: str) -> tuple[list[float], dict]:
    """The progress values seen while `job_id` runs, and its final state."""
    seen: list[float] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        body = client.get(f"/api/analyses/{job_id}").json()
        if body["status"] == "running" and body["progress"] is not None:
            seen.append(body["progress"])
            assert body["message"].startswith("step")
        if body["status"] in ("done", "failed"):
            return seen, body
        time.sleep(0.05)
    raise AssertionError(f"experiment {job_id} did not finish")


def test_unknown_model_is_refused_at_once(client: TestClient) -> None:
    response = client.post("/api/analyses", json={"prompt": "a : b", "model": "other"})
    assert response.status_code == 404
    assert "other" in response.json()["detail"]


def test_unknown_job_is_404(client: TestClient) -> None:
    assert client.get("/api/analyses/a-00000000000000000000000000000000").status_code == 404


def test_too_long_prompt_is_422_with_the_numbers(client: TestClient) -> None:
    response = client.post("/api/analyses", json={"prompt": "one : " * 40})
    assert response.status_code == 422
    assert response.json()["detail"] == "the prompt has 80 tokens; the limit is 64"


@pytest.mark.parametrize("bad", ["L1X2", "l1h2", "L٣H١", "L1H2; drop", "L" + "9" * 9 + "H1"])
def test_a_malformed_extra_head_is_422_naming_it(client: TestClient, bad: str) -> None:
    response = client.post("/api/analyses", json={"prompt": EXAMPLE_PROMPT, "extra_heads": [bad]})
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "extra_heads", 0]
    assert "is not of the form L<layer>H<head>, e.g. L3H1" in error["msg"]


def test_an_extra_head_the_model_lacks_is_422_with_its_size(client: TestClient) -> None:
    response = client.post(
        "/api/analyses", json={"prompt": EXAMPLE_PROMPT, "extra_heads": ["L9H0"]}
    )
    assert response.status_code == 422
    assert response.json()["detail"] == (
        "head 'L9H0' does not exist: 3 layers × 4 heads (L0H0 … L2H3)"
    )
