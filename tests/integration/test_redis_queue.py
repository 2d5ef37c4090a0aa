"""The Redis backend against the real server and the real worker code (tiny model from disk),
run in this process in burst mode (tests.integration.burst_worker): jobs wait in the queue
until the test drains it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from app.main import create_app
from model_worker.contracts.experiments import ExperimentRequest
from model_worker.service.queue.keys import COMPUTED_KEY, result_key
from tests.integration.burst_worker import BurstWorker, burst_worker
from tests.integration.redis_support import private_db, save_tiny_model, wait_for, web_settings
from tests.integration.worker_entry import FAKE_STEPS
from tests.tiny_models import EXAMPLE_PROMPT

pytestmark = [pytest.mark.redis, pytest.mark.slow]
Setup = tuple[Path, str]


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Setup, BurstWorker]]:
    """A tiny model on disk and its in-process worker, on a private Redis database."""
    model = save_tiny_model(tmp_path_factory.mktemp("redis-queue") / "tiny-llama")
    with private_db() as url, burst_worker(model, url) as worker:
        yield (model, url), worker


@pytest.fixture()
def setup(serving: tuple[Setup, BurstWorker]) -> Setup:
    return serving[0]


@pytest.fixture()
def worker(serving: tuple[Setup, BurstWorker]) -> Iterator[BurstWorker]:
    """The worker, live for this test (however long the ones before took); it runs what the
    test left queued afterwards."""
    serving[1].beat()
    yield serving[1]
    serving[1].drain()


def client_for(setup: Setup, **overrides: Any) -> TestClient:
    model, url = setup
    return TestClient(create_app(web_settings(model, url, **overrides)))


@pytest.fixture()
def client(setup: Setup, worker: BurstWorker) -> Iterator[TestClient]:
    with client_for(setup) as test_client:
        yield test_client


def computed(setup: Setup) -> int:
    return int(Redis.from_url(setup[1]).get(COMPUTED_KEY) or 0)


def ended(client: TestClient, job_id: str) -> dict[str, Any]:
    """The state of a job the worker has run (done or failed)."""
    body: dict[str, Any] = client.get(f"/api/analyses/{job_id}").json()
    assert body["status"] in ("done", "failed"), body
    return body


def test_enqueue_dedupe_then_cache_hit(
    client: TestClient, setup: Setup, worker: BurstWorker
) -> None:
    before = computed(setup)
    request = {"prompt": EXAMPLE_PROMPT, "target": "bar"}
    first = client.post("/api/analyses", json=request)
    twins = [client.post("/api/analyses", json=request) for _ in range(4)]
    assert first.status_code == 202
    assert {twin.status_code for twin in twins} == {202}
    assert {twin.json()["id"] for twin in twins} == {first.json()["id"]}
    worker.drain()
    body = ended(client, first.json()["id"])
    assert body["status"] == "done", body
    assert body["result"]["target"]["token"] == "bar"
    assert computed(setup) == before + 1  # five requests, one computation

    hit = client.post("/api/analyses", json=request)
    assert hit.status_code == 200
    assert hit.json()["result"] == body["result"]
    assert computed(setup) == before + 1  # served from Redis, no worker involved


def test_results_outlive_their_ttl_in_redis(setup: Setup, worker: BurstWorker) -> None:
    """Redis drops a result after ICL_RESULT_TTL_S; the durable store keeps the permalink."""
    with client_for(setup, result_ttl_s=1) as client:
        request = {"prompt": "good : foo bad : bar cat :", "target": "foo"}
        job_id = client.post("/api/analyses", json=request).json()["id"]

        def done() -> dict[str, Any] | None:  # seen at once, before its 1 s in Redis ends
            body = client.get(f"/api/analyses/{job_id}").json()
            return body if body["status"] in ("done", "failed") else None

        body = worker.drain_while(lambda: wait_for(done, 60, f"job {job_id}"))
        assert body["status"] == "done"
        connection = Redis.from_url(setup[1])
        wait_for(lambda: not connection.exists(result_key(job_id)), 10, "expiry in Redis")
        before = computed(setup)
        kept = client.get(f"/api/analyses/{job_id}")
        assert kept.status_code == 200 and kept.json() == body
        assert client.get(f"/a/{job_id}/panels/heatmap").status_code == 200
        again = client.post("/api/analyses", json=request)
        assert again.status_code == 200 and again.json()["id"] == job_id
        assert computed(setup) == before  # not computed again


def test_full_queue_answers_429_with_retry_after(setup: Setup, worker: BurstWorker) -> None:
    with client_for(setup, queue_cap=1) as client:
        answers = []
        for number in ("one", "two", "three", "four", "five"):
            answers.append(client.post("/api/analyses", json={"prompt": f"cat : {number} dog :"}))
            if answers[-1].status_code == 429:
                break
        refused = answers[-1]
        assert refused.status_code == 429, [a.status_code for a in answers]
        assert int(refused.headers["Retry-After"]) >= 1
        assert "full" in refused.json()["detail"]
        assert [answer.status_code for answer in answers] == [202, 429]  # nothing ran meanwhile
        worker.drain()
        assert ended(client, answers[0].json()["id"])["status"] == "done"


def test_no_worker_for_the_model_is_refused_at_once(client: TestClient) -> None:
    response = client.post("/api/analyses", json={"prompt": "a : b", "model": "gpt-nowhere"})
    assert response.status_code == 404
    detail = response.json()["detail"]
    assert "gpt-nowhere" in detail and "tiny-llama" in detail


def test_a_failing_job_fails_alone(client: TestClient, worker: BurstWorker) -> None:
    oom = client.post("/api/analyses", json={"prompt": "oom : foo cat :"}).json()
    bad = client.post("/api/analyses", json={"prompt": "cat : foo dog :", "labels": ["zebra"]})
    good = client.post("/api/analyses", json={"prompt": "cat : foo dog : bar one :"}).json()
    worker.drain()
    oom_state = ended(client, oom["id"])
    assert oom_state["status"] == "failed"
    assert oom_state["error"].startswith("out of memory")
    bad_state = ended(client, bad.json()["id"])
    assert bad_state["status"] == "failed"
    assert "zebra" in bad_state["error"] and "internal" not in bad_state["error"]
    assert ended(client, good["id"])["status"] == "done"  # the worker kept serving
    assert len(client.get("/api/models").json()) == 1


def test_experiment_progress_reaches_the_api(client: TestClient, worker: BurstWorker) -> None:
    backend = client.app.state.backend  # type: ignore[attr-defined]
    request = ExperimentRequest(name="mrr", dataset="animal-country", n=3, seed=int(time.time()))
    job = client.portal.call(backend.submit_experiment, request)  # type: ignore[union-attr]
    assert job.id.startswith("e-")
    seen: list[float] = []
    messages: set[str] = set()

    def finished() -> dict[str, Any] | None:
        body = client.get(f"/api/analyses/{job.id}").json()
        if body["status"] == "running" and body["progress"] is not None:
            seen.append(body["progress"])
            messages.add(body["message"])
        return body if body["status"] in ("done", "failed") else None

    body = worker.drain_while(lambda: wait_for(finished, 60, "the experiment"))
    assert body["status"] == "done", body
    assert body["experiment"]["metrics"]["steps"] == FAKE_STEPS
    # the job reports 1.0 ("done") just before it returns, so a poll may see 1.0 while running
    assert len(set(seen)) >= 2 and seen == sorted(seen) and min(seen) < 1 and max(seen) <= 1
    assert any(message.startswith("step") for message in messages)


def test_models_and_health_report_the_worker(client: TestClient, setup: Setup) -> None:
    models = client.get("/api/models").json()
    assert [model["name"] for model in models] == [str(setup[0])]
    assert models[0]["workers"] == 1 and models[0]["fingerprint"]
    health = client.get("/healthz").json()
    assert health["mode"] == "redis" and health["redis"] == "ok"
    assert health["workers"][0]["model"] == str(setup[0])


def test_too_long_prompt_is_refused_at_submission(client: TestClient) -> None:
    """The worker publishes its tokenizer and limit; the web tier (no model) counts tokens."""
    response = client.post("/api/analyses", json={"prompt": "one : " * 40})
    assert response.status_code == 422
    assert response.json()["detail"] == "the prompt has 80 tokens; the limit is 64"
    assert client.post("/api/analyses", json={"prompt": "one : two :"}).status_code in (200, 202)


def test_the_per_head_stage_reaches_the_api_before_the_details(
    client: TestClient, worker: BurstWorker
) -> None:
    """The worker publishes the per-head stage in the job's meta: a running analysis already
    answers with its heads (no details, no label / other split yet), then the whole result."""
    body = {"prompt": f"details-later {time.time()} : foo six : bar two : foo one :"}
    job_id = client.post("/api/analyses", json=body).json()["id"]

    def heads_stage() -> dict[str, Any] | None:
        state = client.get(f"/api/analyses/{job_id}").json()
        assert state["status"] != "failed", state
        return state if state["status"] == "running" and state["result"] else None

    partial = worker.drain_while(lambda: wait_for(heads_stage, 30, "the per-head stage"))
    assert partial["result"]["head_details"] == {} and partial["result"]["heads"]
    assert partial["message"] == "computing the head details"
    done = ended(client, job_id)
    assert done["status"] == "done" and len(done["result"]["head_details"]) >= 1
    unsplit = [
        {**head, "label_increase": None, "other_increase": None} for head in done["result"]["heads"]
    ]
    assert partial["result"]["heads"] == unsplit
    assert None not in {head["label_increase"] for head in done["result"]["heads"]}
