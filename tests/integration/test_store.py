"""The durable store, on SQLite and on a fresh PostgreSQL database: requests, parts, states."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.store import DONE, FAILED, PENDING, ResultStore, StoreError, open_store
from model_worker.common.settings import Settings


def test_a_request_is_kept_until_its_result_and_then_the_result(store: ResultStore) -> None:
    store.remember("a-1", "analysis", "m", "fp", '{"prompt": "x"}')
    store.remember("a-1", "analysis", "m", "fp", '{"prompt": "x"}')  # twice: one row
    job = store.job("a-1")
    assert job is not None and job.state == PENDING and job.request == '{"prompt": "x"}'
    assert [j.id for j in store.pending()] == ["a-1"]
    assert store.parts("a-1") is None and not store.has_result("a-1")

    parts = {"core": b'{"a": 1}', "mrr": b"{}", "h:L0H1": b"\x00\xff binary ok"}
    store.save("a-1", parts)
    job = store.job("a-1")
    assert job is not None and job.state == DONE and store.pending() == []
    assert store.parts("a-1") == parts
    assert store.parts("a-1", ["core", "h:L9H9"]) == {"core": b'{"a": 1}'}
    assert store.has_result("a-1")


def test_a_failure_keeps_its_reason_and_a_new_submission_resets_it(store: ResultStore) -> None:
    store.remember("a-2", "analysis", "m", "fp", "{}")
    store.fail("a-2", "labels not in the prompt")
    job = store.job("a-2")
    assert job is not None and (job.state, job.error) == (FAILED, "labels not in the prompt")
    store.remember("a-2", "analysis", "m", "fp", "{}")
    job = store.job("a-2")
    assert job is not None and (job.state, job.error) == (PENDING, None)


def test_the_store_survives_reopening(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    first = open_store(settings)
    first.remember("e-1", "experiment", "m", "fp", "{}")
    first.save("e-1", {"body": b"{}"})
    first.close()
    again = open_store(settings)
    assert again.parts("e-1") == {"body": b"{}"}
    again.close()


def test_an_unreachable_postgres_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="unreachable"):
        open_store(Settings(database_url="postgresql://postgres@127.0.0.1:1/none"))
