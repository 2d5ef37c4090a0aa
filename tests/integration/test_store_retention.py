"""The durable store is bounded (issue 24.7): retention by age and bytes, the oldest unpinned
results first, pinned permalinks and pending jobs kept; uploaded datasets stored once."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from app import store as store_module
from app.store import SQLITE_FILE, ResultStore, open_store
from model_worker.common.settings import Settings
from model_worker.contracts.experiments import ExperimentRequest

DATASET = "text,label\n" + "".join(f"sentence number {i},{'ab'[i % 2]}\n" for i in range(20_000))
PART = b"x" * 10_000


def experiment(seed: int) -> str:
    request = ExperimentRequest(
        name="accuracy", dataset="upload", dataset_text=DATASET, dataset_filename="d.csv", n=8
    )
    return request.model_copy(update={"seed": seed}).model_dump_json()


def test_an_uploaded_dataset_is_stored_once(store: ResultStore) -> None:
    for seed in range(6):
        store.remember(f"e-{seed}", "experiment", "m", "fp", experiment(seed))
    assert len(DATASET) > 400_000
    assert store.size() < 1.5 * len(DATASET)  # six experiments, one copy of their dataset
    stored = store.job("e-3")
    assert stored is not None
    request = stored.parsed_request()
    assert isinstance(request, ExperimentRequest)
    assert request.dataset_text == DATASET and request.seed == 3
    assert [job.id for job in store.pending()] == [f"e-{seed}" for seed in range(5, -1, -1)]


def finish(store: ResultStore, monkeypatch: pytest.MonkeyPatch, job_id: str, at: float) -> None:
    monkeypatch.setattr(store_module.time, "time", lambda: at)
    store.remember(job_id, "analysis", "m", "fp", json.dumps({"prompt": job_id}))
    store.save(job_id, {"core": PART})
    monkeypatch.undo()


def test_the_oldest_unpinned_results_go_first_pinned_and_pending_stay(
    store: ResultStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(10):
        finish(store, monkeypatch, f"a-{n}", at=1_000_000.0 + n)
    assert store.pin("a-0") and not store.pin("a-nothing")
    store.remember("a-pending", "analysis", "m", "fp", '{"prompt": "p"}')
    held = store.size()
    assert held > 10 * len(PART)
    pruned = store.prune(max_bytes=held - 3 * len(PART))
    assert pruned == ["a-1", "a-2", "a-3"]  # the oldest unpinned, in order, just enough
    assert store.size() <= held - 3 * len(PART)
    assert store.parts("a-0") == {"core": PART}  # pinned: kept although the oldest
    assert store.parts("a-1") is None and store.job("a-1") is None
    assert store.parts("a-9") == {"core": PART}
    assert store.job("a-pending") is not None  # accepted, not finished: never pruned
    assert store.prune(max_bytes=held) == []


def test_results_older_than_the_age_limit_go(
    store: ResultStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = store_module.time.time()
    finish(store, monkeypatch, "a-old", at=now - 10 * 86400)
    finish(store, monkeypatch, "a-pinned-old", at=now - 10 * 86400)
    finish(store, monkeypatch, "a-new", at=now - 60)
    store.pin("a-pinned-old")
    assert store.prune(max_bytes=0, max_age_s=7 * 86400) == ["a-old"]
    assert store.parts("a-new") is not None and store.parts("a-pinned-old") is not None


def test_pruning_drops_datasets_no_job_uses(
    store: ResultStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.remember("e-1", "experiment", "m", "fp", experiment(1))
    store.save("e-1", {"body": b"{}"})
    with_dataset = store.size()
    assert store.prune(max_bytes=1) == ["e-1"]
    assert store.size() < with_dataset - len(DATASET) // 2


def test_a_store_of_an_earlier_version_is_upgraded(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    old = sqlite3.connect(folder / SQLITE_FILE)
    old.execute(
        "CREATE TABLE icl_jobs (id TEXT PRIMARY KEY, kind TEXT NOT NULL, model TEXT NOT NULL, "
        "fingerprint TEXT NOT NULL, request TEXT NOT NULL, state TEXT NOT NULL, error TEXT, "
        "created_at DOUBLE PRECISION NOT NULL, finished_at DOUBLE PRECISION)"
    )
    old.execute(
        "INSERT INTO icl_jobs VALUES ('a-1', 'analysis', 'm', 'fp', '{\"prompt\": \"x\"}', "
        "'done', NULL, 1.0, 2.0)"
    )
    old.commit()
    old.close()
    store = open_store(Settings(data_dir=folder))
    stored = store.job("a-1")
    assert stored is not None and stored.state == "done"
    assert store.pin("a-1") and store.prune(max_bytes=1) == []
    store.close()


def test_a_pinned_permalink_outlives_the_retention_that_removes_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.store import Retention
    from tests.app_clients import embedded_client
    from tests.integration.redis_support import wait_for

    monkeypatch.setattr(Retention, "PRUNE_EVERY_S", 0.0)
    settings = Settings(
        model="tiny-llama",
        data_dir=tmp_path,
        store_max_bytes=0,  # unbounded until the results are in
        rate_limit_per_minute=0,
        write_rate_limit_per_minute=0,
    )
    with embedded_client(settings) as client:
        ids = [
            client.post("/api/analyses", json={"prompt": f"cat : foo dog{n} : bar cat :"}).json()[
                "id"
            ]
            for n in range(2)
        ]
        for job_id in ids:
            wait_for(
                lambda job_id=job_id: (
                    client.get(f"/api/analyses/{job_id}").json()["status"] == "done"
                ),
                60,
                job_id,
            )
        kept, dropped = ids
        assert client.put(f"/api/pins/{kept}").json() == {"id": kept, "pinned": True}
        assert client.put("/api/pins/a-" + "0" * 32).status_code == 404
        assert client.put("/api/pins/not-an-id").status_code == 422
        backend = client.app.state.backend  # type: ignore[attr-defined]
        store = backend._store
        settings.store_max_bytes = 1  # now every unpinned finished result is over the bound
        asyncio.run(backend.maintain())
        assert store.parts(kept) is not None  # pinned: kept
        assert store.job(dropped) is None and store.parts(dropped) is None
        assert client.delete(f"/api/pins/{kept}").json() == {"id": kept, "pinned": False}
