"""Permalinks that outlive Redis: a private redis-server restarted without persistence (all
data lost), results past their TTL, and a lost result recomputed when its page is opened; with
the durable store on SQLite and on a fresh PostgreSQL database. Real worker processes."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from app.main import create_app
from model_worker.service.queue.keys import COMPUTED_KEY, result_key
from tests.integration.db_support import fresh_postgres
from tests.integration.redis_support import (
    OwnRedis,
    redis_with_workers,
    save_tiny_model,
    wait_for,
    wait_for_workers,
    web_settings,
)
from tests.integration.test_redis_failures import final_state

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(params=["sqlite", "postgres"])
def store_options(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Settings of the web tier's durable store."""
    if request.param == "sqlite":
        yield {"data_dir": tmp_path / "data"}
        return
    with fresh_postgres() as url:
        yield {"database_url": url}


@contextmanager
def stack(tmp_path: Path, delay_s: float) -> Iterator[tuple[Path, OwnRedis]]:
    """A private redis-server without persistence and one worker (tiny model)."""
    model = save_tiny_model(tmp_path / "tiny-llama")
    with redis_with_workers(tmp_path, model, delay_s=delay_s, stop_with=signal.SIGKILL) as stack:
        yield model, stack[0]


def web(model: Path, redis: OwnRedis, store: dict[str, Any], **options: Any) -> TestClient:
    """A web tier (a fresh process's worth of state: no in-memory cache carried over)."""
    return TestClient(create_app(web_settings(model, redis.url, **store, **options)))


def test_permalinks_and_accepted_jobs_survive_a_redis_restart_that_loses_everything(
    tmp_path: Path, store_options: dict[str, Any]
) -> None:
    with stack(tmp_path, delay_s=1.5) as (model, redis):
        with web(model, redis, store_options) as client:
            done_id = client.post("/api/analyses", json={"prompt": "cat : foo dog :"}).json()["id"]
            done = final_state(client, done_id)
            assert done["status"] == "done"
            accepted = [
                client.post("/api/analyses", json={"prompt": p})
                for p in ("dog : bar cat :", "cat : bar cat :", "dog : foo dog :")
            ]
            assert [a.status_code for a in accepted] == [202, 202, 202]

        redis.stop()
        with web(model, redis, store_options) as client:  # Redis away: finished work still shows
            assert client.get(f"/api/analyses/{done_id}").json() == done
            assert client.get(f"/a/{done_id}").status_code == 200
            assert client.get(f"/api/analyses/{accepted[0].json()['id']}").status_code == 503
        redis.start()  # empty: queue, jobs and results are gone
        wait_for_workers(redis.url, 1)

        with web(model, redis, store_options) as client:
            again = client.get(f"/api/analyses/{done_id}")
            assert again.status_code == 200 and again.json() == done
            assert client.get(f"/a/{done_id}/panels/heatmap").status_code == 200
            head = done["result"]["top_heads"][0]
            assert client.get(f"/api/analyses/{done_id}/heads/{head}").status_code == 200
            for answer in accepted:  # each ends done, none is "unknown"
                job_id = answer.json()["id"]
                final = final_state(client, job_id)
                assert final["status"] == "done", final


def test_a_result_lost_before_anyone_read_it_is_recomputed_when_opened(
    tmp_path: Path, store_options: dict[str, Any]
) -> None:
    """The worker finished, then Redis lost everything before the web tier copied the result:
    the stored request computes it again when its permalink is opened."""
    with stack(tmp_path, delay_s=0) as (model, redis):
        connection = Redis.from_url(redis.url)
        with web(model, redis, store_options) as client:
            job_id = client.post("/api/analyses", json={"prompt": "cat : foo dog :"}).json()["id"]
            wait_for(lambda: connection.exists(result_key(job_id)), 60, "the worker's result")
            connection.flushdb()  # our own private server: its data is lost
            wait_for_workers(redis.url, 1)
            page = client.get(f"/a/{job_id}")
            assert page.status_code == 200
            assert final_state(client, job_id)["status"] == "done"
            assert int(connection.get(COMPUTED_KEY) or 0) == 1  # computed again
        connection.close()


def test_a_permalink_outlives_the_result_ttl(tmp_path: Path, store_options: dict[str, Any]) -> None:
    with stack(tmp_path, delay_s=0) as (model, redis):
        connection = Redis.from_url(redis.url)
        with web(model, redis, store_options, result_ttl_s=1) as client:
            job_id = client.post("/api/analyses", json={"prompt": "cat : foo dog :"}).json()["id"]
            done = final_state(client, job_id)
            wait_for(lambda: not connection.exists(result_key(job_id)), 10, "expiry")
        with web(model, redis, store_options) as client:
            assert client.get(f"/api/analyses/{job_id}").json() == done
            assert client.get(f"/a/{job_id}").status_code == 200
        assert int(connection.get(COMPUTED_KEY) or 0) == 1  # never computed again
        connection.close()
