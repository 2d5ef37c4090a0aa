"""Fixtures of the integration tier."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from app.queue.redis_backend import RedisBackend
from app.store import ResultStore, open_store
from model_worker.common.settings import Settings
from tests.integration.db_support import fresh_postgres
from tests.integration.redis_support import private_db, web_settings, write_fake_beat

MODEL = "tiny-model"


@pytest.fixture
def backend() -> Iterator[RedisBackend]:
    """A Redis backend on a private database with one fake live worker (a heartbeat written
    by hand, no process): jobs stay queued, so each step is driven by the test."""
    with private_db() as url:
        connection = Redis.from_url(url)
        write_fake_beat(connection, MODEL, period_s=60)
        backend = RedisBackend(web_settings(MODEL, url))  # type: ignore[arg-type]
        try:
            yield backend
        finally:
            backend._redis.close()
            backend._store.close()
            connection.close()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ResultStore]:
    """An empty durable store, on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        opened = open_store(Settings(data_dir=tmp_path / "data"))
        yield opened
        opened.close()
        return
    with fresh_postgres() as url:
        opened = open_store(Settings(database_url=url))
        yield opened
        opened.close()
