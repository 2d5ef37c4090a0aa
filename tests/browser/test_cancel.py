"""Cancel in a real browser: a running experiment's page has a Cancel button; clicking it stops
the experiment within a slice, and the page says it was cancelled and by whom (issue 40)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from app.main import create_app
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.experiments import batching
from tests.browser.live import serve
from tests.tiny_models import tiny_llama

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]
SLICE_DELAY_S = 0.2


@pytest.fixture(scope="module")
def slow_url() -> Iterator[str]:
    """A live tiny-model server whose experiment slices each take SLICE_DELAY_S longer."""
    real = batching._run_part

    def slow_part(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SLICE_DELAY_S)
        return real(*args, **kwargs)

    batching._run_part = slow_part  # type: ignore[assignment]
    try:
        settings = Settings(model="tiny-llama", warm_up=False)
        app = create_app(settings, embedded_backend(settings, loader=tiny_llama))
        with serve(app) as url:
            yield url
    finally:
        batching._run_part = real  # type: ignore[assignment]


def test_cancel_on_a_running_experiment(page: Page, slow_url: str) -> None:
    asked = {"name": "ablation", "dataset": "sentiment-number", "n": 200, "seed": 11}
    job_id = str(page.request.post(f"{slow_url}/api/experiments", data=asked).json()["id"])
    page.goto(f"{slow_url}/e/{job_id}")
    expect(page.locator("[data-status=running]")).to_be_visible(timeout=120_000)
    # named while it runs, as once it is done (before: a bare "Experiment")
    expect(page.locator("#page-title")).to_contain_text("ablation")
    expect(page.locator("#page-title")).to_contain_text("sentiment-number · n = 200")
    page.get_by_role("button", name="Cancel").click()
    expect(page.get_by_role("heading", name="The experiment was cancelled")).to_be_visible(
        timeout=30_000
    )
    expect(page.locator(".status--failed .error")).to_have_text("cancelled by its submitter")
    state = page.request.get(f"{slow_url}/api/analyses/{job_id}").json()
    assert state["status"] == "failed" and state["error"] == "cancelled by its submitter"
