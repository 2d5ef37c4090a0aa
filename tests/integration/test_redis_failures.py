"""Failures against real processes: workers killed mid-job, SIGTERM, Redis going away and back."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from app.main import create_app
from model_worker.service.queue.keys import interactive_queue_name
from model_worker.service.queue.reaper import STRANDED_AFTER_S, rq_queue
from tests.integration.redis_support import (
    private_db,
    redis_with_workers,
    save_tiny_model,
    serving_workers,
    wait_for,
    web_settings,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def running_on(
    client: TestClient, job_id: str, dead: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The heartbeat of the worker running `job_id` (waits until one not in `dead` is)."""

    def worker() -> dict[str, Any] | None:
        assert client.get(f"/api/analyses/{job_id}").json()["status"] != "failed"
        for beat in client.get("/healthz").json()["workers"]:
            if beat["current_job"] == job_id and beat["name"] not in dead:
                return dict(beat)
        return None

    found: dict[str, Any] = wait_for(worker, 60, f"a worker to run {job_id}")
    return found


def kill_runner(
    client: TestClient,
    job_id: str,
    workers: list[subprocess.Popen[bytes]],
    dead: frozenset[str] = frozenset(),
) -> str:
    """SIGKILL the (live) worker process running `job_id`; its name."""
    name: str = running_on(client, job_id, dead)["name"]
    pid = int(name.split(".")[-2])  # worker names are host.pid.random
    (process,) = [worker for worker in workers if worker.pid == pid]
    process.send_signal(signal.SIGKILL)
    process.wait()
    return name


def final_state(client: TestClient, job_id: str, timeout: float = 90) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        body = client.get(f"/api/analyses/{job_id}").json()
        return body if body["status"] in ("done", "failed") else None

    state: dict[str, Any] = wait_for(finished, timeout, f"job {job_id} to finish")
    return state


def test_killed_worker_job_is_retried_once_then_failed(tmp_path: Path) -> None:
    model = save_tiny_model(tmp_path / "tiny-llama")
    with (
        private_db() as url,
        serving_workers(
            model, url, tmp_path, count=3, delay_s=4, stop_with=signal.SIGKILL
        ) as workers,
        TestClient(create_app(web_settings(model, url))) as client,
    ):
        # killed once: a live worker takes it over and finishes it
        first = client.post("/api/analyses", json={"prompt": "cat : foo dog :"}).json()
        kill_runner(client, first["id"], workers)
        retried = final_state(client, first["id"])
        assert retried["status"] == "done", retried

        # killed twice: failed, with the reason
        second = client.post("/api/analyses", json={"prompt": "dog : bar cat :"}).json()
        killed = kill_runner(client, second["id"], workers)
        kill_runner(client, second["id"], workers, frozenset({killed}))
        failed = final_state(client, second["id"])
        assert failed["status"] == "failed"
        assert "stopped" in failed["error"] and "retry" in failed["error"]


def test_a_job_its_worker_took_but_never_started_is_run_by_another(tmp_path: Path) -> None:
    """A worker SIGKILLed after Redis handed it a job (RQ's BLMOVE into the intermediate list)
    but before it started the job left the job queued in that list until RQ's maintenance failed
    it 10 minutes later, its client polling meanwhile (a hang seen once in CI, test_faults).
    Stopping the worker (SIGSTOP) while it waits on the queue holds that window open."""
    model = save_tiny_model(tmp_path / "tiny-llama")
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    with (
        private_db() as url,
        serving_workers(model, url, tmp_path / "first", stop_with=signal.SIGKILL) as (frozen,),
        TestClient(create_app(web_settings(model, url))) as client,
    ):
        connection = Redis.from_url(url)
        db = connection.connection_pool.connection_kwargs.get("db", 0)
        wait_for(  # stopped any earlier (or between two of RQ's waits) it would take nothing
            lambda: any(
                client["cmd"] == "blmove" and int(client["db"]) == db
                for client in connection.client_list()
            ),
            30,
            "the worker to wait on the queue",
        )
        frozen.send_signal(signal.SIGSTOP)
        job = client.post("/api/analyses", json={"prompt": "cat : foo dog :"}).json()
        queue = rq_queue(interactive_queue_name(str(model)), connection)
        wait_for(
            lambda: connection.lrange(queue.intermediate_queue_key, 0, -1) == [job["id"].encode()],
            10,
            "Redis to hand the job to the stopped worker",
        )
        frozen.send_signal(signal.SIGKILL)
        frozen.wait()
        with serving_workers(model, url, tmp_path / "second"):
            state = final_state(client, job["id"], timeout=STRANDED_AFTER_S + 60)
        assert state["status"] == "done", state
        connection.close()


def test_redis_restart_gives_503_then_recovers(tmp_path: Path) -> None:
    model = save_tiny_model(tmp_path / "tiny-llama")
    with (
        redis_with_workers(tmp_path, model, delay_s=2, stop_with=signal.SIGKILL) as stack,
        TestClient(create_app(web_settings(model, stack[0].url))) as client,
    ):
        redis, (worker,) = stack
        job = client.post("/api/analyses", json={"prompt": "cat : foo dog :"}).json()
        assert final_state(client, job["id"])["status"] == "done"

        redis.stop()
        started = time.monotonic()
        # a finished result is immutable: the web tier still answers it from memory
        cached = client.get(f"/api/analyses/{job['id']}")
        assert cached.status_code == 200 and cached.json()["status"] == "done"
        for answer in (
            client.get("/api/models"),
            client.get("/api/analyses/a-00000000000000000000000000000000"),
            client.post("/api/analyses", json={"prompt": "dog : bar cat :"}),
            client.get("/healthz"),
        ):
            assert answer.status_code == 503
            assert "Redis" in answer.json()["detail"]
            assert answer.headers["Retry-After"]
        assert time.monotonic() - started < 30  # a guard against hanging, not a benchmark

        redis.start()  # empty: the worker must come back by itself
        wait_for(lambda: client.get("/api/models").json(), 60, "the worker to reappear")
        again = client.post("/api/analyses", json={"prompt": "dog : bar cat :"}).json()
        running_on(client, again["id"])

        # SIGTERM mid-job: the job finishes, then the worker leaves
        worker.send_signal(signal.SIGTERM)
        assert final_state(client, again["id"])["status"] == "done"
        assert worker.wait(timeout=30) == 0
        assert client.get("/api/models").json() == []
    assert os.path.isdir(tmp_path / "redis")
