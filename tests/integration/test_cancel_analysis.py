"""A running analysis can be cancelled (issue 40.3): `DELETE /api/jobs/{id}` stops it at its
next stage boundary (after the per-head stage, or after the details), keeps nothing of it, and
its state says who cancelled it; on the embedded server and on a lab worker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from model_worker.common.settings import Settings
from model_worker.service import jobs
from model_worker.service.queue.keys import heads_stage_key, result_key
from model_worker.service.queue.result_parts import DETAILS_MESSAGE
from tests.app_clients import embedded_client
from tests.integration.burst_worker import burst_worker
from tests.integration.redis_support import private_db, save_tiny_model, wait_for, web_settings

PROMPT = "love : bar like : bar eight : foo two : foo one :"


def state(client: TestClient, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = client.get(f"/api/analyses/{job_id}").json()
    return body


def until(client: TestClient, job_id: str, done: Callable[[dict[str, Any]], bool]) -> dict:
    found: dict[str, Any] = wait_for(
        lambda: body if done(body := state(client, job_id)) else None, 60, job_id
    )
    return found


@pytest.fixture()
def held(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Each analysis waits after its per-head stage until the event is set (the test cancels
    it meanwhile); set at the end, so nothing stays blocked."""
    release = threading.Event()
    real = jobs.run_analysis

    def run_analysis(loaded: Any, request: Any, on_heads: Any = None, **kwargs: Any) -> Any:
        def heads_then_hold(partial: Any) -> None:
            if on_heads is not None:
                on_heads(partial)
            release.wait(30)

        return real(loaded, request, heads_then_hold, **kwargs)

    monkeypatch.setattr(jobs, "run_analysis", run_analysis)
    yield release
    release.set()


def test_a_running_analysis_is_cancelled_at_its_next_stage_and_keeps_nothing(
    held: threading.Event,
) -> None:
    settings = Settings(model="tiny-llama", write_rate_limit_per_minute=0, warm_up=False)
    with embedded_client(settings) as client:
        job_id = client.post("/api/analyses", json={"prompt": PROMPT}).json()["id"]
        until(client, job_id, lambda body: body.get("message") == DETAILS_MESSAGE)
        answer = client.delete(f"/api/jobs/{job_id}")
        assert answer.status_code == 200, answer.text
        assert answer.json()["message"].startswith("cancelling (asked by its submitter)")
        # until it stops, its status says it is being cancelled, not merely running
        assert (
            client.get(f"/api/analyses/{job_id}")
            .json()["message"]
            .startswith("cancelling (asked by its submitter)")
        )
        held.set()  # the details are computed, then the analysis stops before it is kept
        failed = until(client, job_id, lambda body: body["status"] in ("done", "failed"))
        assert failed["status"] == "failed" and failed["error"] == "cancelled by its submitter"
        backend = client.app.state.backend  # type: ignore[attr-defined]
        assert client.portal.call(backend.read_parts, job_id) is None  # type: ignore[union-attr]
        assert client.portal.call(backend.read_heads_stage, job_id) is None  # type: ignore[union-attr]
        assert client.delete(f"/api/jobs/{job_id}").status_code == 409
        again = client.post("/api/analyses", json={"prompt": PROMPT}).json()  # runs afresh
        assert until(client, again["id"], lambda body: body["status"] == "done")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, Any]]:
    model = save_tiny_model(tmp_path_factory.mktemp("cancel-analysis") / "tiny-llama")
    with private_db() as url, burst_worker(model, url) as worker:
        yield model, url, worker


@pytest.mark.redis
@pytest.mark.slow
def test_a_lab_worker_stops_a_cancelled_analysis_at_its_next_stage(
    lab: tuple[Any, str, Any],
) -> None:
    model, url, worker = lab
    with TestClient(create_app(web_settings(model, url))) as client:
        # `details-later`: the worker waits 1.5 s between the per-head stage and the details
        body = {"prompt": f"details-later {time.time()} : foo six : bar two : foo one :"}
        job_id = client.post("/api/analyses", json=body).json()["id"]

        def cancel_once_running() -> dict[str, Any]:
            until(client, job_id, lambda body: body.get("message") == DETAILS_MESSAGE)
            answer = client.delete(f"/api/jobs/{job_id}")
            assert answer.status_code == 200, answer.text
            state = client.get(f"/api/analyses/{job_id}").json()
            assert state["status"] != "running" or state["message"].startswith("cancelling")
            return until(client, job_id, lambda body: body["status"] in ("done", "failed"))

        failed = worker.drain_while(cancel_once_running)
        assert failed["status"] == "failed" and failed["error"] == "cancelled by its submitter"
        assert not worker.connection.exists(result_key(job_id), heads_stage_key(job_id))
        store = client.app.state.backend._store  # type: ignore[attr-defined]
        assert not store.has_result(job_id)
