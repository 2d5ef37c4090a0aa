"""Pins with owners and bounds (issue 37.3) and retention that sees everything (37.4): only who
pinned a result (or an admin) un-pins it; pins are capped per owner and in all, in a room of
their own, so one user's pins never make retention delete everyone else's results; parts are
written only under a live job row, orphans are swept, and a pruned result's Redis copy goes
with it, so a pruned permalink stays pruned. Before, anyone un-pinned anything, one user could
pin past the store's bound, and a result pruned within 10 minutes of finishing came back from
Redis as parts that retention never saw."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from app.main import create_app
from app.queue.redis_backend import RedisBackend
from app.store import PinCaps, PinRefused, ResultStore, Retention
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.run.analyze import analyze
from model_worker.service.jobs import store_parts
from model_worker.service.queue.keys import result_key
from model_worker.service.queue.reaper import fetch_job
from model_worker.service.queue.result_parts import analysis_parts
from model_worker.service.queue.states import JobStatus
from tests.integration.redis_support import signed_as_worker
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama

PART = b"x" * 10_000
ALICE, BOB, CAROL = (
    "alice-token-0123456789abcdef",
    "bob-token-0123456789abcdefgh",
    "carol-tok-0123456789abcdefghij",
)


def done(store: ResultStore, job_id: str) -> None:
    store.remember(job_id, "analysis", "m", "fp", json.dumps({"prompt": job_id}))
    assert store.save(job_id, {"core": PART})


def orphans(store: ResultStore) -> int:
    rows = store._run(
        "SELECT COUNT(*) FROM icl_parts WHERE job_id NOT IN (SELECT id FROM icl_jobs)",
        fetch=True,
    )
    return int(rows[0][0])


# --- 3: pins with owners and bounds ----------------------------------------------------------


def test_one_users_pins_never_take_the_room_of_the_others_results(store: ResultStore) -> None:
    caps = PinCaps(per_owner=40_000, total=40_000)
    for n in range(12):  # one user's results, then pins of more than the store's bound
        done(store, f"a-mine-{n}")
    for n in range(6):  # the others' newer results
        done(store, f"a-others-{n}")
    pinned, refused = [], []
    for n in range(12):
        try:
            store.pin(f"a-mine-{n}", owner="user:mallory", admin=False, caps=caps)
            pinned.append(n)
        except PinRefused as exc:
            assert exc.status == 409 and "ICL_PIN_MAX_BYTES" in str(exc)
            refused.append(n)
    assert pinned == [0, 1, 2] and len(refused) == 9
    bound = 110_000  # room for the pins (40 000) and 7 unpinned results of ~10 000
    pruned = store.prune(max_bytes=bound, caps=caps)
    kept = [n for n in range(6) if store.parts(f"a-others-{n}") is not None]
    assert kept == list(range(6)), pruned  # the others' results all stay
    assert all(store.parts(f"a-mine-{n}") is not None for n in pinned)
    assert store.size() <= bound


def test_a_pin_that_grows_past_its_quota_loses_its_protection(store: ResultStore) -> None:
    caps = PinCaps(per_owner=15_000, total=0)
    done(store, "a-first")
    store.pin("a-first", owner="user:bob", admin=False, caps=caps)
    store.remember("a-pending", "analysis", "m", "fp", '{"prompt": "p"}')
    store.pin("a-pending", owner="user:bob", admin=False, caps=caps)  # 0 bytes yet: allowed
    assert store.save("a-pending", {"core": PART})  # now bob's pins hold ~20 000 bytes
    assert store.prune(max_bytes=1, caps=caps) == ["a-pending"]  # the later pin went
    assert store.parts("a-first") is not None


def app_of(backend: RedisBackend) -> TestClient:
    settings = backend._settings.model_copy(
        update={
            "users": {"alice": SecretStr(ALICE), "bob": SecretStr(BOB), "carol": SecretStr(CAROL)},
            "admins": ["carol"],
            "rate_limit_per_minute": 0,
            "write_rate_limit_per_minute": 0,
        }
    )
    app = create_app(settings, backend)
    app.state.backend = backend
    return TestClient(app, base_url="http://localhost", client=("10.0.0.1", 40000))


def as_user(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_only_who_pinned_or_an_admin_unpins(backend: RedisBackend) -> None:
    client = app_of(backend)
    job_id = client.post(
        "/api/analyses", json={"prompt": "cat : foo dog : bar cat :"}, headers=as_user(ALICE)
    ).json()["id"]
    assert client.put(f"/api/pins/{job_id}", headers=as_user(ALICE)).status_code == 200
    refused = client.delete(f"/api/pins/{job_id}", headers=as_user(BOB))
    assert refused.status_code == 403 and "pinned by someone else" in refused.text
    assert client.put(f"/api/pins/{job_id}", headers=as_user(BOB)).status_code == 200
    assert client.delete(f"/api/pins/{job_id}", headers=as_user(BOB)).status_code == 403
    stored = backend._store._run(
        "SELECT pinned, pinned_by FROM icl_jobs WHERE id = ?", (job_id,), True
    )
    assert tuple(stored[0]) == (1, "user:alice")
    assert client.delete(f"/api/pins/{job_id}", headers=as_user(CAROL)).status_code == 200
    assert client.put(f"/api/pins/{job_id}", headers=as_user(BOB)).status_code == 200
    assert client.delete(f"/api/pins/{job_id}", headers=as_user(BOB)).status_code == 200


# --- 4: retention that sees everything --------------------------------------------------------


def test_parts_are_written_only_under_a_live_job_row_and_orphans_are_swept(
    store: ResultStore,
) -> None:
    assert not store.save("a-never-accepted", {"core": PART})
    assert store.parts("a-never-accepted") is None
    done(store, "a-kept")
    store._run(
        "INSERT INTO icl_parts (job_id, name, data) VALUES (?, ?, ?)", ("a-ghost", "core", PART)
    )
    assert orphans(store) == 1
    store.prune(max_bytes=0)
    assert orphans(store) == 0 and store.parts("a-kept") is not None


@pytest.fixture
def fast_retention(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(Retention, "PRUNE_EVERY_S", 0.0)
    yield


def finished_by_a_worker(backend: RedisBackend, job_id: str) -> None:
    """What a worker leaves once it ran the job: no job record (result_ttl 0), its result."""
    fetch_job(job_id, backend._redis).delete()


def test_a_pruned_result_stays_pruned(backend: RedisBackend, fast_retention: None) -> None:
    """The red team's order: a result finishes, is read (kept in the store), is pruned within
    the 10 minutes its Redis copy lives on, and its permalink is opened again."""
    request = AnalysisRequest(prompt="cat : foo dog : bar cat :")
    job_id = backend._submit(request, "10.0.0.1").id
    parts = {"core": b'{"x": 1}', "summary": PART}
    store_parts(
        backend._redis, job_id, signed_as_worker(backend._settings, job_id, request, parts), 3600
    )
    finished_by_a_worker(backend, job_id)
    state = backend._status(job_id)
    assert state is not None and state.status == JobStatus.DONE
    assert backend._store.parts(job_id) == parts and backend._redis.exists(result_key(job_id))

    tight = backend._settings.model_copy(update={"store_max_bytes": 1})
    backend._retention = Retention(backend._store, tight)
    backend._maintain()
    assert backend._store.job(job_id) is None
    assert not backend._redis.exists(result_key(job_id))  # the Redis copy went with it
    for _ in range(2):  # read again (the permalink), then the next retention pass
        assert asyncio.run(backend.status(job_id)) is None
        assert asyncio.run(backend.done_body(job_id)) is None
        backend._maintain()
    assert backend._store.parts(job_id) is None and orphans(backend._store) == 0
    client = app_of(backend)
    assert client.get(f"/api/analyses/{job_id}", headers=as_user(ALICE)).status_code == 404


def test_a_result_pruned_by_another_web_process_is_not_adopted_again(
    backend: RedisBackend, fast_retention: None
) -> None:
    """Two web processes, one store: the second prunes; the first, which read the result
    before (and kept its body in memory), neither serves it nor brings it back from a Redis
    copy left behind. It served the kept body for up to a minute before."""
    request = AnalysisRequest(prompt=EXAMPLE_PROMPT)
    job_id = backend._submit(request, "10.0.0.1").id
    parts = analysis_parts(analyze(tiny_llama(), EXAMPLE_PROMPT, top_k_heads=1))
    signed = signed_as_worker(backend._settings, job_id, request, parts)
    store_parts(backend._redis, job_id, signed, 3600)
    finished_by_a_worker(backend, job_id)
    assert backend._status(job_id).status == JobStatus.DONE  # type: ignore[union-attr]
    assert asyncio.run(backend.done_body(job_id)) is not None  # kept in this process
    backend._store.prune(max_bytes=1)  # the other process's pass (it left the Redis copy)
    store_parts(backend._redis, job_id, signed, 3600)
    assert asyncio.run(backend.done_body(job_id)) is None
    assert asyncio.run(backend.status(job_id)) is None
    assert backend._store.parts(job_id) is None and orphans(backend._store) == 0
    assert not backend._redis.exists(result_key(job_id))


def test_a_pruned_results_figure_files_go_with_it(
    backend: RedisBackend, fast_retention: None
) -> None:
    """A figure file kept in memory was served before anything was read: a pruned result's
    heatmap still answered 200, on every web process, for as long as the process lived."""
    request = AnalysisRequest(prompt=EXAMPLE_PROMPT, top_k_heads=2)
    job_id = backend._submit(request, "10.0.0.1").id
    parts = analysis_parts(analyze(tiny_llama(), EXAMPLE_PROMPT, top_k_heads=2))
    signed = signed_as_worker(backend._settings, job_id, request, parts)
    store_parts(backend._redis, job_id, signed, 3600)
    finished_by_a_worker(backend, job_id)
    client = app_of(backend)
    url = f"/figures/{job_id}/heatmap.svg"
    served = client.get(url, headers=as_user(ALICE))
    assert served.status_code == 200 and "<svg" in served.text
    assert client.get(url, headers=as_user(ALICE)).text == served.text  # kept
    backend._store.prune(max_bytes=1)  # another web process's retention pass
    backend._redis.delete(result_key(job_id))
    gone = client.get(url, headers=as_user(ALICE))
    assert gone.status_code == 404, gone.status_code
