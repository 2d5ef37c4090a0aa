"""The JSON API over the embedded backend, with a tiny model."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.embedded import EmbeddedBackend
from app.main import create_app
from app.settings import Settings
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama


@pytest.fixture()
def client() -> Iterator[TestClient]:
    settings = Settings(model="tiny-llama")
    backend = EmbeddedBackend(settings, loader=tiny_llama)
    with TestClient(create_app(settings, backend)) as test_client:
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


def test_bad_prompt_fails_the_job_with_its_message(client: TestClient) -> None:
    job = client.post("/api/analyses", json={"prompt": "   "}).json()
    body = wait_done(client, job["id"])
    assert body["status"] == "failed"
    assert "empty" in body["error"]


def test_unknown_model_is_refused_at_once(client: TestClient) -> None:
    response = client.post("/api/analyses", json={"prompt": "a : b", "model": "other"})
    assert response.status_code == 404
    assert "other" in response.json()["detail"]


def test_unknown_job_is_404(client: TestClient) -> None:
    assert client.get("/api/analyses/a-nothing").status_code == 404
