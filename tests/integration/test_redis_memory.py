"""A full Redis never wedges the service (issue 24.6), with the real worker code (burst mode,
in this process) and real redis-servers: results live in a cache apart from the queue that
evicts when full (compose's `cache` service: allkeys-lru), and a worker whose result write
Redis refuses (out of memory under noeviction) fails that job with the reason, instead of
retrying the write forever, and goes on with the next job."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from redis import Redis

from app.main import create_app
from model_worker.service import jobs
from tests.integration.burst_worker import burst_worker
from tests.integration.redis_support import (
    ROOT,
    OwnRedis,
    private_db,
    save_tiny_model,
    wait_for,
    web_settings,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("redis-memory") / "tiny-llama")


def ended(client: TestClient, job_id: str) -> dict[str, Any] | None:
    body: dict[str, Any] = client.get(f"/api/analyses/{job_id}").json()
    return body if body["status"] in ("done", "failed") else None


def test_a_full_results_cache_evicts_and_every_job_still_ends_done(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = COMPOSE["services"]["cache"]["command"]
    policy = command[command.index("--maxmemory-policy") + 1]
    with private_db() as queue_url, OwnRedis(tmp_path / "cache") as cache:
        cached = Redis.from_url(cache.url)
        used = int(cached.info("memory")["used_memory"])
        cached.config_set("maxmemory-policy", policy)  # compose's cache: allkeys-lru
        cached.config_set("maxmemory", used + 600_000)  # room for ~3 tiny results (150 kB)
        monkeypatch.setenv("ICL_CACHE_REDIS_URL", cache.url)
        settings = web_settings(model, queue_url, cache_redis_url=cache.url)
        with burst_worker(model, queue_url) as worker, TestClient(create_app(settings)) as client:
            ids = [
                client.post(
                    "/api/analyses", json={"prompt": f"cat : foo dog{n} : bar cat :"}
                ).json()["id"]
                for n in range(8)
            ]
            worker.drain()  # 8 results written into room for 3: the oldest are evicted
            assert int(cached.info("stats")["evicted_keys"]) > 0
            assert not Redis.from_url(queue_url).keys("icl:result:*")  # none in the queue

            def all_done() -> bool:
                states = [ended(client, job_id) for job_id in ids]
                if None in states:
                    worker.drain()  # an evicted result: its job was enqueued again
                    return False
                return True

            wait_for(all_done, 120, "every job done")
            assert {ended(client, job_id)["status"] for job_id in ids} == {"done"}  # type: ignore[index]
        cached.close()


def test_a_result_write_refused_by_a_full_redis_fails_the_job_with_the_reason(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_store_parts = jobs.store_parts
    with OwnRedis(tmp_path / "queue") as queue:  # noeviction, as Redis starts by default
        connection = Redis.from_url(queue.url)

        def full_redis_meanwhile(*args: Any, **kwargs: Any) -> None:
            connection.config_set("maxmemory", 1)  # every write refused (OOM), deletes allowed
            threading.Timer(1.5, lambda: connection.config_set("maxmemory", 0)).start()
            real_store_parts(*args, **kwargs)

        settings = web_settings(model, queue.url)
        with burst_worker(model, queue.url) as worker, TestClient(create_app(settings)) as client:
            first = client.post("/api/analyses", json={"prompt": "cat : foo dog : bar cat :"})
            monkeypatch.setattr(jobs, "store_parts", full_redis_meanwhile)
            started = time.monotonic()
            worker.drain()
            assert time.monotonic() - started < jobs.REFUSED_RETRY_S  # no endless retries
            body = wait_for(lambda: ended(client, first.json()["id"]), 30, "the first job")
            assert body["status"] == "failed", body
            assert "Redis refused to store the result" in body["error"]
            assert "OOM" in body["error"] or "memory" in body["error"]

            monkeypatch.setattr(jobs, "store_parts", real_store_parts)
            second = client.post("/api/analyses", json={"prompt": "dog : bar cat : foo dog :"})
            worker.drain()  # the worker goes on with the next job
            body = wait_for(lambda: ended(client, second.json()["id"]), 30, "the second job")
            assert body["status"] == "done", body
        connection.close()
