"""A newcomer's first hour in Chromium (issue 28): the model still loading, digit labels that
SmolLM2-style tokenizers split off a leading space, a prompt without labels, and a comparison
started from a pasted permalink."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from app.main import create_app
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.model.loading import LoadedModel
from tests.browser.live import serve
from tests.unit.test_label_reading import DIGITS, spaced_model

pytestmark = pytest.mark.browser

NO_LABELS = "love hate like good bad love hate like"


class HeldLoader:
    """Loads the model only once `go` is set: the server starts with its model loading."""

    def __init__(self) -> None:
        self.go = threading.Event()

    def __call__(self) -> LoadedModel:
        self.go.wait(120)
        return spaced_model()


@pytest.fixture(scope="module")
def held() -> HeldLoader:
    return HeldLoader()


@pytest.fixture(scope="module")
def first_hour_url(held: HeldLoader, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = Settings(model="tiny-spaced", data_dir=tmp_path_factory.mktemp("first-hour"))
    app = create_app(settings, embedded_backend(settings, loader=held))
    with serve(app) as url:
        try:
            yield url
        finally:
            held.go.set()


def analyse(page: Page, prompt: str, target: str = "") -> None:
    page.fill("textarea[name=prompt]", prompt)
    page.fill('input[name="target"]', target)
    page.click("#analyse")


def test_the_first_hour(page: Page, first_hour_url: str, held: HeldLoader, artifacts: Path) -> None:
    page.set_viewport_size({"width": 1440, "height": 900})
    # 1. the model is still loading: the page says so, and a form sent meanwhile keeps its text
    page.goto(first_hour_url)
    note = page.locator("[data-loading]")
    expect(note).to_contain_text("loading tiny-spaced (about ")
    analyse(page, DIGITS, target="1")
    expect(page.locator('[role="alert"]')).to_contain_text("is loading")
    expect(page.locator("textarea[name=prompt]")).to_have_value(DIGITS)
    page.screenshot(path=str(artifacts / "first-hour-loading.png"))
    held.go.set()
    expect(page.locator("[data-loading]")).to_have_count(0, timeout=20_000)  # polled every 2 s

    # 2. digit labels: the target is the digit, and the digit labels equal to it are true
    analyse(page, DIGITS, target="1")
    expect(page.locator(".analysis-body[data-status=done]")).to_be_visible(timeout=30_000)
    expect(page.locator(".target strong").first).to_have_text("1")
    true_labels = page.locator(".token-strip .tok--true")
    expect(true_labels).to_have_count(2)
    assert true_labels.all_inner_texts() == ["1", "1"]
    assert page.locator(".token-strip .tok--false").all_inner_texts() == ["0", "0"]
    expect(page.locator("[data-note]").first).to_contain_text("appended")
    digits_permalink = page.url
    assert "/a/a-" in digits_permalink
    page.screenshot(path=str(artifacts / "first-hour-digits.png"), full_page=True)

    # 3. no labels: one grouped warning above the figures, not one per label
    page.goto(first_hour_url)
    analyse(page, NO_LABELS)
    expect(page.locator(".analysis-body[data-status=done]")).to_be_visible(timeout=30_000)
    box = page.locator('[data-panel="warnings"]')
    expect(box).to_have_count(1)
    expect(box.locator('[data-warning="no_icl_shape"]')).to_have_count(1)
    heatmap_box = page.locator(".panel-heatmap").bounding_box()
    warnings_box = box.bounding_box()
    assert heatmap_box is not None and warnings_box is not None
    assert warnings_box["y"] < heatmap_box["y"]  # above the figures
    page.screenshot(path=str(artifacts / "first-hour-warning.png"), full_page=True)
    no_labels_id = page.url.split("/a/")[1].split("?")[0]
    page.goto(f"{page.url}?present=1&theme=dark")  # a talk: the same warning, large and dark
    expect(page.locator('[data-warning="no_icl_shape"]')).to_be_visible()
    page.screenshot(path=str(artifacts / "first-hour-warning-present.png"))
    page.goto(page.url.split("?")[0] + "?present=0&theme=light")

    # 4. compare with the digits analysis, pasting its permalink
    page.fill("form[data-compare-with] input[name=b]", digits_permalink)
    page.click("form[data-compare-with] button[type=submit]")
    expect(page.locator(".compare-body[data-status=done]")).to_be_visible(timeout=30_000)
    assert "/compare?a=a-" in page.url and "&b=a-" in page.url  # the permalink became its id
    expect(page.locator('[data-panel="compare-warnings"]')).to_contain_text("different labels")
    expect(page.locator(".compare-side")).to_have_count(2)
    page.set_viewport_size({"width": 1280, "height": 720})
    page.screenshot(path=str(artifacts / "first-hour-compare.png"), full_page=True)

    # 5. "compare with…" offers the analyses this browser opened, newest first, never itself
    page.goto(digits_permalink)
    options = page.locator("#recent-analyses option")
    expect(options.first).to_have_attribute("value", no_labels_id)
    assert digits_permalink.split("/a/")[1] not in options.evaluate_all("o => o.map(x => x.value)")
