"""Idle work between jobs: the embedded server and a Redis worker build the U_h of heads
detailed once while no job waits (`jobs.build_seen_heads`), so that a head's second analysis
already projects through it; a waiting job stops that work."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.queue.embedded import EmbeddedBackend
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.service import jobs
from tests.integration.redis_support import (
    private_db,
    save_tiny_model,
    serving_workers,
    wait_for,
    web_settings,
)
from tests.integration.test_api_embedded import wait_done
from tests.tiny_models import tiny_llama
from tests.unit.test_head_unembeddings import head_key

#: Too short for U_h at first sight on the tiny model: its heads are only noted as seen.
SHORT_PROMPT = "love : bar two : foo one :"
ANALYSIS = {"prompt": SHORT_PROMPT, "target": "foo", "top_k_heads": 4}


def embedded(data_dir: Path) -> TestClient:
    settings = Settings(
        model="tiny-llama",
        data_dir=data_dir,
        rate_limit_per_minute=0,
        write_rate_limit_per_minute=0,
    )
    return TestClient(create_app(settings, embedded_backend(settings, loader=tiny_llama)))


def test_the_embedded_server_builds_seen_heads_when_idle(tmp_path: Path) -> None:
    with embedded(tmp_path) as client:
        backend: EmbeddedBackend = client.app.state.backend  # type: ignore[attr-defined]
        kept = backend._model.result(timeout=60).head_unembeddings
        job = client.post("/api/analyses", json=ANALYSIS).json()
        assert wait_done(client, job["id"])["status"] == "done"
        details = client.get(f"/api/analyses/{job['id']}").json()["result"]["head_details"]
        heads = [head_key(name) for name in details]
        wait_for(lambda: all(kept.holds(head) for head in heads), 30, "the idle build")


def test_a_waiting_job_stops_the_idle_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The idle build checks for waiting jobs before each head: a job submitted while the
    first head builds runs right after it; the other heads are built once it is done."""
    building, release = threading.Event(), threading.Event()
    second_done: list[bool] = []  # at each head's build: was the second job done?
    second_id: list[str] = []
    real = jobs.unembedding_builder

    def slow_builder(loaded):  # type: ignore[no-untyped-def]
        build = real(loaded)
        assert build is not None

        def observed(key: tuple[int, int]):  # type: ignore[no-untyped-def]
            second_done.append(bool(second_id) and backend._memory.get(second_id[0]) is not None)
            building.set()
            release.wait(30)
            return build(key)

        return observed

    monkeypatch.setattr(jobs, "unembedding_builder", slow_builder)
    with embedded(tmp_path) as client:
        backend: EmbeddedBackend = client.app.state.backend  # type: ignore[attr-defined]
        first = client.post("/api/analyses", json=ANALYSIS).json()
        assert building.wait(30)  # the first job is done; its heads' build has begun
        second = client.post("/api/analyses", json={**ANALYSIS, "prompt": "cat : foo dog :"})
        second_id.append(second.json()["id"])
        release.set()
        assert wait_done(client, second_id[0])["status"] == "done"
        assert wait_done(client, first["id"])["status"] == "done"
        wait_for(lambda: len(second_done) > 2, 30, "the idle build after the second job")
    assert second_done[0] is False and all(second_done[1:]), second_done


@pytest.mark.redis
@pytest.mark.slow
def test_a_redis_worker_builds_seen_heads_between_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ICL_WARM_UP", "0")  # nothing kept before the first job
    model = save_tiny_model(tmp_path / "tiny-llama")
    with (
        private_db() as url,
        serving_workers(model, url, tmp_path) as workers,
        TestClient(create_app(web_settings(model, url))) as client,
    ):
        # a worker computes at nice 10 (ICL_WORKER_NICE): the web tier's answers come first
        assert os.getpriority(os.PRIO_PROCESS, workers[0].pid) == 10
        job = client.post("/api/analyses", json=ANALYSIS).json()
        assert wait_done(client, job["id"], 90)["status"] == "done"
        log = tmp_path / "worker.log"
        wait_for(lambda: "seen once in" in log.read_text(), 30, "the worker's idle U_h build")
