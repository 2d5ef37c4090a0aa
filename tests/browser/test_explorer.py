"""The explorer in a real browser: analyse, heatmap, head panel, download, XSS probe."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Dialog, Page, expect

from tests.tiny_models import EXAMPLE_PROMPT

pytestmark = pytest.mark.browser
XSS = "<script>alert(1)</script> : foo <img src=x onerror=alert(1)> : bar one :"


def test_analyse_then_open_a_head(page: Page, base_url: str, artifacts: Path) -> None:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("response", lambda r: errors.append(r.url) if r.status >= 400 else None)
    page.goto(base_url + "/")
    page.fill("textarea[name=prompt]", EXAMPLE_PROMPT)
    page.fill("input[name=target]", "foo")
    page.click("#analyse")
    cells = page.locator("svg[data-figure=heatmap] rect.cell")
    expect(cells).to_have_count(12, timeout=30_000)
    assert "/a/a-" in page.url
    expect(page.locator(".token-strip .tok--true")).to_have_count(2)
    page.screenshot(path=artifacts / "analysis.png", full_page=True)

    page.locator("rect.cell[data-layer='2'][data-head='1']").click()
    head = page.locator("#head-panel .head[data-head-name=L2H1]")
    expect(head).to_be_visible(timeout=30_000)
    assert page.url.endswith("?head=L2H1")
    expect(head.locator("svg[data-figure=attention] rect.bar")).to_have_count(14)
    expect(head.locator("svg[data-figure=attention] rect.bar--true")).to_have_count(2)
    expect(head.locator("table[data-table=values] tbody tr")).to_have_count(4)
    expect(head.locator("table[data-table=keys] tbody tr")).to_have_count(4)
    head.scroll_into_view_if_needed()
    page.screenshot(path=artifacts / "head-panel.png", full_page=True)

    other = page.locator("rect.cell[data-layer='1'][data-head='3']")
    other.focus()  # the keyboard opens a head too
    page.keyboard.press("Enter")
    expect(page.locator("#head-panel .head[data-head-name=L1H3]")).to_be_visible(timeout=30_000)
    assert page.url.endswith("?head=L1H3")
    page.go_back()  # and the history goes back to the previous head
    expect(page.locator("#head-panel .head[data-head-name=L2H1]")).to_be_visible(timeout=30_000)

    with page.expect_download() as download_info:
        page.click("[data-figure=heatmap] a.download[data-format=svg]")
    saved = artifacts / "downloaded-heatmap.svg"
    download_info.value.save_as(saved)
    svg = saved.read_text()
    assert svg.startswith("<?xml") and svg.count('data-layer="') == 12
    assert errors == []


def test_presentation_mode_dark(page: Page, base_url: str, artifacts: Path) -> None:
    page.goto(base_url + "/")
    page.click("#analyse")  # the paper preset is in the box already
    expect(page.locator("svg[data-figure=heatmap]")).to_be_visible(timeout=30_000)
    page.click("a[data-toggle=present]")
    page.click("a[data-toggle=theme]")
    expect(page.locator("html.present[data-theme=dark]")).to_have_count(1)
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(0, 0, 0)"
    page.screenshot(path=artifacts / "presentation-dark.png", full_page=True)


def test_xss_probe_shows_text_and_fires_nothing(page: Page, base_url: str, artifacts: Path) -> None:
    dialogs: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.goto(base_url + "/")
    page.fill("textarea[name=prompt]", XSS)
    page.click("#analyse")
    prompt = page.locator("[data-prompt]")
    expect(prompt).to_have_text(XSS, timeout=30_000)
    expect(page.locator("svg[data-figure=heatmap]")).to_be_visible()
    assert page.locator("img[src=x]").count() == 0
    page.locator("rect.cell").first.click()
    expect(page.locator("#head-panel .head")).to_be_visible(timeout=30_000)
    page.screenshot(path=artifacts / "xss-probe.png", full_page=True)
    assert dialogs == []


def test_the_heatmap_comes_first_then_the_details(
    page: Page, base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page draws the per-head stage while the head details are held back; a head opened
    meanwhile waits for them, then the whole body replaces the first one with that head kept."""
    from model_worker import analyze as analyze_module

    release = threading.Event()
    real = analyze_module.head_details

    def held(*args: Any, **kwargs: Any) -> Any:
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(analyze_module, "head_details", held)
    try:
        page.goto(base_url + "/")
        page.fill("textarea[name=prompt]", "six : foo hate : bar two : foo one :")
        page.click("#analyse")
        expect(page.locator(".analysis-body[data-status=heads]")).to_be_visible(timeout=30_000)
        expect(page.locator("svg[data-figure=heatmap] rect.cell")).to_have_count(12)
        expect(page.locator(".details-pending")).to_be_visible()
        page.locator("rect.cell[data-layer='1'][data-head='2']").click()
        expect(page.locator("#head-panel")).to_contain_text("on their way")
    finally:
        release.set()
    expect(page.locator(".analysis-body[data-status=done]")).to_be_visible(timeout=30_000)
    expect(page.locator(".details-pending")).to_have_count(0)
    head = page.locator("#head-panel .head[data-head-name=L1H2]")
    expect(head).to_be_visible(timeout=30_000)
    expect(page.locator("table.top-heads th", has_text="MRR").first).to_be_visible()
