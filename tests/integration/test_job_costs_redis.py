"""A cost on every job (issue 37.1), over the Redis backend and the real worker code (tiny model
from disk, an in-process burst worker on a private Redis database): a patching job is priced at
submission in forward passes × tokens (422 naming ICL_MAX_PATCH_COST and the knobs to lower)
and again in the job; patches and experiments share one batch-work share per client, apart from
the analyses'. Before, any patch within the schema's maximums was queued, a worker ran it
whatever it cost, and patches counted against the 20-analyses share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.queue.redis_backend import RedisBackend
from model_worker.checks.budget import patch_passes
from model_worker.contracts.patching import PatchRequest
from tests.integration.burst_worker import BurstWorker, burst_worker
from tests.integration.redis_support import private_db, save_tiny_model, web_settings
from tests.tiny_models import EXAMPLE_PROMPT

pytestmark = [pytest.mark.redis, pytest.mark.slow]
FAST = {"labels": ["foo", "bar"], "top_k": 3, "qkv_heads": 1, "directions": ["denoising"]}
#: the schema's maximums, as the red team sent them
MOST = {"labels": ["foo", "bar"], "top_k": 200, "qkv_heads": 20}
MOST_HEADS = [f"L{layer}H{head}" for layer in range(2) for head in range(4)]
Setup = tuple[Path, str]


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Setup, BurstWorker]]:
    model = save_tiny_model(tmp_path_factory.mktemp("redis-costs") / "tiny-llama")
    with private_db() as url, burst_worker(model, url) as worker:
        yield (model, url), worker


@pytest.fixture()
def worker(serving: tuple[Setup, BurstWorker]) -> Iterator[BurstWorker]:
    serving[1].beat()
    yield serving[1]
    serving[1].drain()


def web(serving: tuple[Setup, BurstWorker], **options: Any) -> TestClient:
    model, url = serving[0]
    return TestClient(create_app(web_settings(model, url, **options)))


def test_a_patch_over_the_budget_is_refused_at_submission_naming_the_knobs(
    serving: tuple[Setup, BurstWorker], worker: BurstWorker
) -> None:
    with web(serving, max_patch_cost=2_000) as client:
        most = client.post(
            "/api/patch", json={"prompt": EXAMPLE_PROMPT, **MOST, "heads": MOST_HEADS}
        )
        assert most.status_code == 422, most.text
        detail = most.json()["detail"]
        assert "ICL_MAX_PATCH_COST" in detail and "forward passes" in detail
        assert detail.index("heads patched per position") < detail.index("top_k")
        assert "directions to one" in detail and "the prompt's length" in detail
        cheap = client.post("/api/patch", json={"prompt": EXAMPLE_PROMPT, **FAST})
        assert cheap.status_code == 202, cheap.text


def test_a_decomposition_outside_the_prompt_is_refused_at_submission(
    serving: tuple[Setup, BurstWorker], worker: BurstWorker
) -> None:
    """The second attack: `towers_position` 10**30 (or past the prompt's last token) was
    queued, and the worker failed the job with a traceback in its log."""
    asked = {"prompt": EXAMPLE_PROMPT, "towers": ["L0H1"]}
    with web(serving) as client:
        for position, said in ((10**30, "less than"), (5_000, "outside the prompt")):
            for field in ("towers_position", "towers_versus"):
                refused = client.post("/api/analyses", json=asked | {field: position})
                assert refused.status_code == 422 and said in refused.text, refused.text
        assert client.post("/api/analyses", json=asked | {"towers_position": 3}).status_code == 202


def test_the_worker_prices_the_patch_again(
    serving: tuple[Setup, BurstWorker], worker: BurstWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A web tier with a looser budget (another version, a stored request enqueued again)
    cannot make a worker run a job over its own budget: the job fails with the reason."""
    strict = worker.worker.settings.model_copy(update={"max_patch_cost": 100})
    monkeypatch.setattr(worker.worker, "settings", strict)
    with web(serving) as client:
        request = {"prompt": EXAMPLE_PROMPT, **FAST, "corruption": "query"}
        queued = client.post("/api/patch", json=request)
        assert queued.status_code == 202, queued.text
        worker.drain()
        body = client.get(f"/api/analyses/{queued.json()['id']}").json()
    assert body["status"] == "failed", body
    assert "over the budget" in body["error"] and "ICL_MAX_PATCH_COST" in body["error"]


def test_the_price_counts_every_exactly_patched_row() -> None:
    """The red team's count: 2 × (1 + 200 + 60 + 8·482 + 60) rows on SmolLM2 (30 layers × 9
    heads), plus attribution and the recordings."""
    request = PatchRequest(prompt="x", top_k=200, qkv_heads=20, heads=["L0H0"] * 8)
    rows = 2 * (1 + 200 + 60 + 8 * 482 + 60)
    assert patch_passes(request, 482, 30, 9) == rows + 2 * 2 + 3


def prompt(n: int) -> str:
    words = ["love", "like", "eight", "two", "one", "cat", "dog", "three"]
    return f"{words[n % 8]} : bar {words[(n + 3) % 8]} : foo {words[(n + 5) % 8]} : bar one :"


def test_patches_and_experiments_share_one_batch_work_share(backend: RedisBackend) -> None:
    """The fake worker never takes a job: each stays queued and counts."""
    backend._settings = backend._settings.model_copy(
        update={"client_experiments": 2, "client_queued_jobs": 20}
    )
    app = create_app(backend._settings, backend)
    app.state.backend = backend
    client = TestClient(app)
    for n in range(2):
        patch = client.post("/api/patch", json={"prompt": prompt(n), "labels": ["foo", "bar"]})
        assert patch.status_code == 202, patch.text
    third = client.post("/api/patch", json={"prompt": prompt(2), "labels": ["foo", "bar"]})
    assert third.status_code == 429, third.text
    assert "ICL_CLIENT_EXPERIMENTS" in third.json()["detail"]
    experiment = client.post(
        "/api/experiments", json={"name": "accuracy", "dataset": "sentiment-number", "n": 10}
    )
    assert experiment.status_code == 429, experiment.text
    analysis = client.post("/api/analyses", json={"prompt": prompt(3)})
    assert analysis.status_code == 202, analysis.text  # the analyses' share is apart
