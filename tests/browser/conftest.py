"""Browser fixtures: one live tiny-model server and one Chromium per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from app.main import create_app
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from tests.browser.live import launch, serve
from tests.tiny_models import tiny_llama

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    settings = Settings(model="tiny-llama")
    app = create_app(settings, embedded_backend(settings, loader=tiny_llama))
    with serve(app) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = launch(playwright)
        yield chromium
        chromium.close()


@pytest.fixture()
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    yield tab
    context.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
