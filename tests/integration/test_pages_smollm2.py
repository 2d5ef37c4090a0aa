"""The analysis page of a 64-token prompt on the real model stays under 300 KB of HTML."""

from __future__ import annotations

import json
import time

import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient

from app.main import create_app
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.model.loading import LoadedModel

pytestmark = pytest.mark.slow
DEMOS = ["love : bar", "eight : foo", "hate : bar", "two : foo", "happy : bar", "six : foo"]


@pytest.fixture(scope="module")
def model(request: pytest.FixtureRequest) -> LoadedModel:
    """The session's shared SmolLM2 (tests/conftest.py), loaded here if that fixture is absent."""
    try:
        loaded: LoadedModel = request.getfixturevalue("smollm2")
    except pytest.FixtureLookupError:
        from model_worker.model.loading import load_model

        loaded = load_model(device="cpu", dtype="float32")
    return loaded


def prompt_of(model: LoadedModel, tokens: int) -> str:
    best = ""
    for n in range(1, 60):
        candidate = " ".join([DEMOS[i % len(DEMOS)] for i in range(n)] + ["one :"])
        if len(model.tokenizer(candidate).input_ids) > tokens:
            return best
        best = candidate
    return best


def test_64_token_analysis_page_is_light(model: LoadedModel) -> None:
    settings = Settings()
    prompt = prompt_of(model, 64)
    assert 56 <= len(model.tokenizer(prompt).input_ids) <= 64
    with TestClient(create_app(settings, embedded_backend(settings, loader=lambda: model))) as c:
        job_id = c.post("/api/analyses", json={"prompt": prompt}).json()["id"]
        deadline = time.monotonic() + 240
        while c.get(f"/api/analyses/{job_id}").json()["status"] not in ("done", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        response = c.get(f"/a/{job_id}")
    assert response.status_code == 200
    page = BeautifulSoup(response.text, "html.parser")
    heatmap = page.select_one(".vl-figure[data-figure=heatmap]")
    assert heatmap is not None
    assert len(json.loads(str(heatmap["data-spec"]))["data"]["values"]) == 30 * 9
    assert len(page.select("table.top-heads tbody tr")) == 20
    assert page.select(".vl-figure[data-figure=attention]") == []  # head data loads on demand
    assert len(response.content) <= 300 * 1024
