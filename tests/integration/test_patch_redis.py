"""Activation patching of one prompt over the Redis backend and the real worker code (tiny model
from disk, in-process burst worker on a private Redis database): refused pairs answer 422 at
submission (the workers' published tokenizer and geometry), a job runs once, its signed result
is kept and then served from the cache, and a result planted in Redis unsigned is discarded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from app.main import create_app
from model_worker.service.queue.keys import COMPUTED_KEY, result_key
from tests.integration.burst_worker import BurstWorker, burst_worker
from tests.integration.redis_support import private_db, save_tiny_model, web_settings
from tests.patch_rows import rows_counted
from tests.tiny_models import EXAMPLE_PROMPT

pytestmark = [pytest.mark.redis, pytest.mark.slow]
Setup = tuple[Path, str]
FAST = {"labels": ["foo", "bar"], "top_k": 3, "qkv_heads": 1, "directions": ["denoising"]}


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Setup, BurstWorker]]:
    model = save_tiny_model(tmp_path_factory.mktemp("redis-patch") / "tiny-llama")
    with private_db() as url, burst_worker(model, url) as worker:
        yield (model, url), worker


@pytest.fixture()
def worker(serving: tuple[Setup, BurstWorker]) -> Iterator[BurstWorker]:
    serving[1].beat()
    yield serving[1]
    serving[1].drain()


@pytest.fixture()
def client(serving: tuple[Setup, BurstWorker], worker: BurstWorker) -> Iterator[TestClient]:
    model, url = serving[0]
    with TestClient(create_app(web_settings(model, url))) as test_client:
        yield test_client


def computed(url: str) -> int:
    return int(Redis.from_url(url).get(COMPUTED_KEY) or 0)


def ended(client: TestClient, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = client.get(f"/api/analyses/{job_id}").json()
    assert body["status"] in ("done", "failed"), body
    return body


def test_a_patching_job_runs_once_then_comes_from_the_cache(
    client: TestClient, worker: BurstWorker, serving: tuple[Setup, BurstWorker]
) -> None:
    url = serving[0][1]
    before = computed(url)
    request = {"prompt": EXAMPLE_PROMPT, **FAST}
    first = client.post("/api/patch", json=request)
    twin = client.post("/api/patch", json=request)
    assert first.status_code == 202 and twin.json()["id"] == first.json()["id"]
    job_id = first.json()["id"]
    assert job_id.startswith("p-")
    worker.drain()
    body = ended(client, job_id)
    assert body["status"] == "done", body
    assert body["patching"]["corruption"] == "swap-labels"
    assert (
        len([h for h in body["patching"]["directions"][0]["heads"] if h["exact"] is not None]) == 3
    )
    assert computed(url) == before + 1
    hit = client.post("/api/patch", json=request)
    assert hit.status_code == 200 and hit.json()["patching"] == body["patching"]
    assert computed(url) == before + 1
    page = client.get(f"/p/{job_id}")
    assert page.status_code == 200 and 'data-figure="effects"' in page.text


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"corruption": "prompt", "corrupted_prompt": "love : foo like : foo eight : bar one :"},
            "same token length",
        ),
        (
            {
                "corruption": "prompt",
                "corrupted_prompt": "love bar : like : bar eight : foo two : foo one :",
            },
            "same label layout",
        ),
        ({"corruption": "prompt", "corrupted_prompt": EXAMPLE_PROMPT + " "}, "unchanged"),
        ({"heads": ["L7H0"]}, "does not exist"),
    ],
)
def test_a_pair_that_cannot_be_patched_is_refused_at_submission(
    client: TestClient, body: dict[str, Any], expected: str
) -> None:
    response = client.post("/api/patch", json={"prompt": EXAMPLE_PROMPT, **body})
    assert response.status_code == 422, response.text
    assert expected in response.json()["detail"]


def test_an_unsigned_result_planted_in_redis_is_discarded(
    client: TestClient, worker: BurstWorker, serving: tuple[Setup, BurstWorker]
) -> None:
    request = {"prompt": EXAMPLE_PROMPT, **FAST, "corruption": "query"}
    job_id = client.post("/api/patch", json=request).json()["id"]
    redis = Redis.from_url(serving[0][1])
    redis.hset(result_key(job_id), mapping={"body": b'{"model": "forged"}'})
    assert client.get(f"/api/analyses/{job_id}").json()["status"] != "done"
    assert not redis.exists(result_key(job_id))
    worker.drain()
    body = ended(client, job_id)
    assert body["status"] == "done" and body["patching"]["corruption"] == "query"


def added_head(client: TestClient, job_id: str, head: str) -> str:
    """POST "patch this head per position" on `job_id`'s page; the new job's id."""
    added = client.post(f"/p/{job_id}/heads", data={"head": head}, follow_redirects=False)
    assert added.status_code == 303, added.text
    return added.headers["location"].split("/")[2]


def test_adding_a_head_hands_the_worker_the_stored_patch(
    client: TestClient, worker: BurstWorker, serving: tuple[Setup, BurstWorker]
) -> None:
    """ "Patch this head per position" reran the whole patch on a worker; now the job carries
    the stored result, signed by the web tier for the new request, and the worker runs only
    the pair and the head's rows. A reused result whose signature does not hold is ignored
    (the worker patches whole: nothing unsigned reaches its signature)."""
    from model_worker.service.queue.reaper import fetch_job

    redis = Redis.from_url(serving[0][1])
    request = {"prompt": EXAMPLE_PROMPT, **FAST, "top_k": 2}
    job_id = client.post("/api/patch", json=request).json()["id"]
    worker.drain()
    result = ended(client, job_id)["patching"]
    have = {item["name"] for item in result["directions"][0]["positions"]}
    spare = [h["name"] for h in result["directions"][0]["heads"] if h["name"] not in have]
    with rows_counted(worker.worker.loaded) as rows:
        new_id = added_head(client, job_id, spare[0])
        handed = fetch_job(new_id, redis).args[2]
        assert handed[0] == job_id and len(handed) == 3
        worker.drain()
        reused, reused_rows = ended(client, new_id), sum(rows)
        forged_id = added_head(client, job_id, spare[1])
        forged = fetch_job(forged_id, redis)
        base_id, body, signature = forged.args[2]
        forged.args = [*forged.args[:2], [base_id, body.replace("swap-labels", "query"), signature]]
        forged.save()
        rows.clear()
        worker.drain()
        whole = ended(client, forged_id)
    n_tokens = len(result["tokens"])
    attribution = 0 if spare[0] in result["directions"][0]["estimated_positions"] else 1
    assert reused["status"] == "done", reused
    assert reused_rows == 2 + attribution + n_tokens  # not the whole patch again
    positions = reused["patching"]["directions"][0]["positions"]
    assert [item["name"] for item in positions] == [*have, spare[0]]
    assert whole["status"] == "done" and whole["patching"]["corruption"] == "swap-labels"
    assert sum(rows) > 2 * (2 + 1 + n_tokens)  # the forged copy was not used: patched whole
