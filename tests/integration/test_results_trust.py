"""Issue 24, part A, against the real Redis: results a worker did not sign are never served or
kept (24.1), malformed heartbeats and job records are skipped, never a 500 (24.11), and a queued
job waits for a restarting worker instead of being cancelled (24.13). The web tier runs in this
process over a private database; the worker is a heartbeat written by hand (tests/integration/
conftest.py) unless a test says otherwise."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from app.main import create_app
from app.queue.redis_backend import RedisBackend
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze
from model_worker.service.jobs import store_parts
from model_worker.service.queue.heartbeats import remove_beat
from model_worker.service.queue.keys import (
    LAST_BEATS_KEY,
    WORKERS_KEY,
    heads_stage_key,
    interactive_queue_name,
    result_key,
    worker_key,
)
from model_worker.service.queue.result_parts import CORE, result_parts
from model_worker.service.queue.signing import ResultSigner, request_digest, result_signer
from model_worker.service.queue.states import JobStatus
from tests.integration.burst_worker import burst_worker
from tests.integration.conftest import MODEL
from tests.integration.redis_support import (
    CLAIM,
    private_db,
    save_tiny_model,
    signed_as_worker,
    web_settings,
)
from tests.tiny_models import tiny_llama

pytestmark = pytest.mark.redis

REQUEST = AnalysisRequest(prompt="cat : foo dog : bar cat :")
FORGED_PROMPT = "cat : bar dog : foo dog :"


def forged_parts(model: LoadedModel) -> dict[str, bytes]:
    """A well-formed result of another prompt: what an attacker with Redis access plants."""
    return result_parts(analyze(model, FORGED_PROMPT))


# --- 24.1: forged results -------------------------------------------------------------------


@pytest.mark.parametrize("signature", ["none", "attacker's key"])
def test_a_result_planted_for_a_queued_job_is_discarded_and_the_job_still_runs(
    backend: RedisBackend, tiny_model: LoadedModel, signature: str
) -> None:
    job_id = backend._submit(REQUEST).id
    forged = forged_parts(tiny_model)
    if signature != "none":
        attacker = ResultSigner([b"the-attackers-own-key-0123456789"])
        forged = attacker.signed(job_id, request_digest(REQUEST), forged)
    backend._redis.hset(result_key(job_id), mapping=forged)  # type: ignore[arg-type]

    state = backend._status(job_id)
    assert state is not None and state.status == JobStatus.QUEUED  # not "done" with forgery
    assert asyncio.run(backend.done_body(job_id)) is None
    assert asyncio.run(backend.summary(job_id)) is None
    assert backend._store.parts(job_id) is None  # nothing forged reached the durable store
    assert not backend._redis.exists(result_key(job_id))  # discarded


def test_a_result_planted_for_a_job_never_accepted_is_unknown(
    backend: RedisBackend, tiny_model: LoadedModel
) -> None:
    job_id = "a-" + "0" * 32
    backend._redis.hset(result_key(job_id), mapping=forged_parts(tiny_model))  # type: ignore[arg-type]
    assert backend._status(job_id) is None  # 404, not a permalink to forged numbers
    assert asyncio.run(backend.done_body(job_id)) is None
    assert backend._store.job(job_id) is None and backend._store.parts(job_id) is None


def test_the_store_not_redis_answers_for_a_finished_result(
    backend: RedisBackend, tiny_model: LoadedModel
) -> None:
    """A genuine result is kept once verified; rewriting (or flushing) Redis's copy afterwards
    changes nothing the permalink shows."""
    job_id = backend._submit(REQUEST).id
    genuine = result_parts(analyze(tiny_model, REQUEST.prompt))
    signed = signed_as_worker(backend._settings, job_id, REQUEST, genuine)
    store_parts(backend._redis, job_id, signed, 3600)
    state = backend._status(job_id)
    assert state is not None and state.status == JobStatus.DONE
    assert backend._store.parts(job_id) == genuine  # verified, kept, signature stripped

    backend._bodies = type(backend._bodies)()  # no in-process copy either
    backend._persisted.clear()
    backend._redis.delete(result_key(job_id))
    backend._redis.hset(result_key(job_id), mapping=forged_parts(tiny_model))  # type: ignore[arg-type]
    body = asyncio.run(backend.done_body(job_id))
    assert body is not None and FORGED_PROMPT.encode() not in body
    assert REQUEST.prompt.encode() in body
    backend._redis.flushdb()  # Redis loses everything (the claim of the test database too)
    backend._redis.set(CLAIM, "test", ex=3600)
    assert asyncio.run(backend.done_body(job_id)) == body


def test_a_forged_per_head_stage_is_not_shown(
    backend: RedisBackend, tiny_model: LoadedModel
) -> None:
    job_id = backend._submit(REQUEST).id
    core = forged_parts(tiny_model)[CORE]
    attacker = ResultSigner([b"the-attackers-own-key-0123456789"])
    ours = result_signer(backend._settings)
    stages = [
        core,  # unsigned
        attacker.sign_stage(job_id, request_digest(REQUEST), core),
        ours.sign_stage("a-" + "1" * 32, request_digest(REQUEST), core),  # another job's
        ours.sign_stage(job_id, request_digest(REQUEST), core),  # the worker's
    ]

    async def shown() -> list[bytes | None]:
        seen = []
        for stage in stages:
            backend._redis.set(heads_stage_key(job_id), stage)
            seen.append(await backend.read_heads_stage(job_id))
        return seen

    assert asyncio.run(shown()) == [None, None, None, core]


# --- 24.11: malformed records -----------------------------------------------------------------


@pytest.mark.parametrize("record", ["{not json", '{"name": 5}', '"a string"', "\xff\xfe"])
def test_a_malformed_heartbeat_is_skipped_never_an_error(
    backend: RedisBackend, record: str
) -> None:
    backend._redis.set(worker_key("intruder"), record, ex=60)
    backend._redis.zadd(WORKERS_KEY, {"intruder": time.time() + 60})
    backend._redis.hset(LAST_BEATS_KEY, MODEL, record)
    models = asyncio.run(backend.models())
    assert [model.name for model in models] == [MODEL]  # the good worker still counts
    health = asyncio.run(backend.health())
    assert [worker["name"] for worker in health["workers"]] == ["fake-worker"]
    assert backend._submit(REQUEST).status == JobStatus.QUEUED


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("meta", "{{{"),
        ("status", "weird"),
        ("created_at", "yesterday"),
        ("started_at", "x"),
        ("data", "garbage"),
        ("meta", '{"progress": "abc"}'),
    ],
)
def test_a_malformed_job_record_is_skipped_and_the_job_recovered(
    backend: RedisBackend, field: str, value: str
) -> None:
    job_id = backend._submit(REQUEST).id
    backend._redis.hset(f"rq:job:{job_id}", field, value)
    if field == "meta":
        backend._redis.hset(f"rq:job:{job_id}", "status", "started")
    state = backend._status(job_id)  # no exception: the request is in the durable store
    assert state is not None and state.status in (JobStatus.QUEUED, JobStatus.RUNNING)


# --- 24.13: restarts lose nothing -----------------------------------------------------------


def test_a_queued_job_waits_for_a_worker_of_its_model_then_fails_with_the_reason(
    backend: RedisBackend,
) -> None:
    job_id = backend._submit(REQUEST).id
    remove_beat(backend._redis, "fake-worker")  # its worker restarts: no live worker now
    state = backend._status(job_id)
    assert state is not None and state.status == JobStatus.QUEUED, state
    assert state.message == f"waiting for a worker for {MODEL}"
    other = backend._submit(AnalysisRequest(prompt="dog : foo cat : bar dog :"))
    assert other.status == JobStatus.QUEUED  # accepted (202), not 404

    backend._settings.worker_grace_s = 0.0  # the grace period is over
    backend._seen.clear()
    state = backend._status(job_id)
    assert state is not None and state.status == JobStatus.FAILED
    assert state.error is not None and "ICL_WORKER_GRACE_S" in state.error


def test_after_a_redis_restart_submissions_are_accepted_before_the_next_heartbeat(
    backend: RedisBackend,
) -> None:
    assert asyncio.run(backend.models())  # the web tier has seen the worker
    for key in backend._redis.scan_iter():
        if key != CLAIM.encode():
            backend._redis.delete(key)  # Redis restarted without persistence
    state = backend._submit(REQUEST)
    assert state.status == JobStatus.QUEUED
    assert backend._status(state.id) is not None


def test_a_model_never_seen_is_still_refused_at_once(backend: RedisBackend) -> None:
    from app.queue.interface import BackendError

    with pytest.raises(BackendError) as refused:
        backend._submit(AnalysisRequest(prompt="a : b", model="gpt-nowhere"))
    assert refused.value.status == 404


def test_settings_accept_rotating_keys() -> None:
    from model_worker.common.settings import Settings

    assert Settings(result_keys=SecretStr("a" * 16 + "," + "b" * 16)).result_keys is not None


@pytest.mark.slow
def test_with_a_real_worker_only_its_signed_result_is_served_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Web tier and worker share ICL_RESULT_KEYS; an attacker with Redis access (not the key)
    plants results for the job before and after the worker computes it."""
    monkeypatch.setenv("ICL_RESULT_KEYS", "a-real-secret-shared-by-web-and-workers")
    model = save_tiny_model(tmp_path / "tiny-llama")
    forged = forged_parts(tiny_llama())
    request = {"prompt": REQUEST.prompt, "target": "foo"}
    with private_db() as url, burst_worker(model, url) as worker:
        with TestClient(create_app(web_settings(model, url))) as client:
            job_id = client.post("/api/analyses", json=request).json()["id"]
            worker.connection.hset(result_key(job_id), mapping=forged)  # type: ignore[arg-type]
            assert client.get(f"/api/analyses/{job_id}").json()["status"] == "queued"
            worker.connection.hset(result_key(job_id), mapping=forged)  # type: ignore[arg-type]
            worker.drain()  # the worker does not take the planted result for its own
            body = client.get(f"/api/analyses/{job_id}").json()
            assert body["status"] == "done" and body["result"]["target"]["token"] == "foo"
            genuine = client.get(f"/api/analyses/{job_id}").content

            worker.connection.delete(result_key(job_id))  # rewrite Redis's copy, then flush
            worker.connection.hset(result_key(job_id), mapping=forged)  # type: ignore[arg-type]
        with TestClient(create_app(web_settings(model, url))) as fresh:  # no in-process copy
            assert fresh.get(f"/api/analyses/{job_id}").content == genuine
            for key in worker.connection.scan_iter():
                if key != CLAIM.encode():
                    worker.connection.delete(key)  # FLUSHALL, but for the test's claim
            assert fresh.get(f"/api/analyses/{job_id}").content == genuine


def test_the_page_says_the_job_waits_for_a_worker_of_its_model(backend: RedisBackend) -> None:
    """The status an analysis page polls says why a job does not start during a restart."""
    settings = backend._settings
    with TestClient(create_app(settings, backend)) as client:
        job_id = client.post("/api/analyses", json={"prompt": REQUEST.prompt}).json()["id"]
        remove_beat(backend._redis, "fake-worker")
        polled = client.get(f"/api/analyses/{job_id}").json()
        assert polled["status"] == "queued", polled
        assert polled["message"] == f"waiting for a worker for {MODEL}"
        page = client.get(f"/a/{job_id}/status")
        assert page.status_code == 200 and f"waiting for a worker for {MODEL}" in page.text
        again = client.post("/api/analyses", json={"prompt": "dog : bar cat : foo dog :"})
        assert again.status_code == 202  # the model was seen moments ago: accepted


def test_a_malformed_record_of_another_job_never_costs_a_good_one_its_record(
    backend: RedisBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """A control (it passes on the code before too: RQ already fails to fetch such a record,
    which the reaper skipped); it guards the reaper's per-job skip of malformed records."""
    from rq.job import JobStatus as RqStatus

    from model_worker.service.queue.reaper import fetch_job, rq_queue

    good = backend._submit(REQUEST).id
    bad = backend._submit(AnalysisRequest(prompt="dog : foo cat : bar dog :")).id
    queue = rq_queue(interactive_queue_name(MODEL), backend._redis)
    for job_id in (good, bad):  # both started, by a worker that has died
        job = fetch_job(job_id, backend._redis)
        job.worker_name = "dead-worker"
        job.set_status(RqStatus.STARTED)
        job.save()
        entry = f"{job_id}:execution-1"  # RQ's started registry: "<job id>:<execution id>"
        backend._redis.zadd(queue.started_job_registry.key, {entry: time.time() + 60})
    backend._redis.hset(f"rq:job:{bad}", "status", "weird")
    with caplog.at_level("WARNING"):
        state = backend._status(good)  # reaps the dead worker's jobs: `bad` is skipped
    assert state is not None and state.status in (JobStatus.QUEUED, JobStatus.RUNNING)
    assert f"malformed Redis record of job {good}" not in caplog.text
