"""The explorer in a real browser: analyse, heatmap, head panel, download, XSS probe."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Dialog, Page, Route, expect

from tests.stages import held_head_details, released
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
    cells = page.locator("[data-figure=heatmap] .cell")
    expect(cells).to_have_count(12, timeout=30_000)
    assert "/a/a-" in page.url
    expect(page.locator(".token-strip .tok--true")).to_have_count(2)
    page.screenshot(path=artifacts / "analysis.png", full_page=True)

    page.locator(".vl-figure .cell[data-layer='2'][data-head='1']").click()
    head = page.locator("#head-panel .head[data-head-name=L2H1]")
    expect(head).to_be_visible(timeout=30_000)
    assert page.url.endswith("?head=L2H1")
    attention = head.locator(".vl-figure[data-figure=attention]")
    expect(attention).to_have_attribute("data-drawn", "true", timeout=30_000)
    spec = json.loads(attention.get_attribute("data-spec") or "{}")
    kinds = [bar["kind"] for bar in spec["data"]["values"]]
    assert len(kinds) == 14 and kinds.count("true label") == 2
    expect(attention.locator("g.mark-rect path")).to_have_count(14)  # drawn, one bar each
    expect(head.locator("table[data-table=values] tbody tr")).to_have_count(4)
    keys = head.locator("table[data-table=keys]")
    keys.locator("[data-action=label-keys]").click()  # computed on demand: an extra analysis
    head = page.locator("#head-panel .head[data-head-name=L2H1]")
    expect(head.locator("table[data-table=keys] tbody tr")).to_have_count(4, timeout=30_000)
    head.scroll_into_view_if_needed()
    page.screenshot(path=artifacts / "head-panel.png", full_page=True)

    other = page.locator(".vl-figure .cell[data-layer='1'][data-head='3']")
    other.focus()  # the keyboard opens a head too
    page.keyboard.press("Enter")
    expect(page.locator("#head-panel .head[data-head-name=L1H3]")).to_be_visible(timeout=30_000)
    assert page.url.endswith("?head=L1H3")
    page.go_back()  # and the history goes back to the previous head
    expect(page.locator("#head-panel .head[data-head-name=L2H1]")).to_be_visible(timeout=30_000)

    link = page.locator("[data-figure=heatmap] a.download[data-format=svg]")
    drawn_width = float(page.locator(".vl-figure[data-figure=heatmap] svg").get_attribute("width"))
    assert "width=" in (link.get_attribute("href") or "")  # as wide as on this page
    with page.expect_download() as download_info:
        link.click()
    saved = artifacts / "downloaded-heatmap.svg"
    download_info.value.save_as(saved)
    svg = saved.read_text()
    assert svg.startswith("<svg") and "cells_marks" in svg and "<script" not in svg
    width = float(svg.split('width="', 1)[1].split('"', 1)[0])
    assert abs(width - drawn_width) <= 0.05 * drawn_width, (width, drawn_width)
    assert errors == []


def test_presentation_mode_dark(page: Page, base_url: str, artifacts: Path) -> None:
    page.goto(base_url + "/")
    page.click("#analyse")  # the paper preset is in the box already
    expect(page.locator(".vl-figure[data-figure=heatmap][data-drawn=true]")).to_be_visible(
        timeout=30_000
    )
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
    expect(page.locator(".vl-figure[data-figure=heatmap][data-drawn=true]")).to_be_visible()
    assert page.locator("img[src=x]").count() == 0
    # the top-ranked head is always detailed (no extra analysis to wait for); the click may
    # come while the finished body is on its way: the head stays open in the body that follows
    best = page.locator("table.top-heads tbody tr a").first.inner_text()  # rank 1
    layer, head = best[1:].split("H")
    page.locator(f".vl-figure .cell[data-layer='{layer}'][data-head='{head}']").click()
    expect(page.locator(f"#head-panel .head[data-head-name={best}]")).to_be_visible(timeout=30_000)
    page.screenshot(path=artifacts / "xss-probe.png", full_page=True)
    assert dialogs == []


@pytest.mark.parametrize("page_wait_s", [0.0, 30.0], ids=["spinner-first", "page-waits"])
def test_the_heatmap_comes_first_then_the_details(
    page: Page, base_url: str, monkeypatch: pytest.MonkeyPatch, page_wait_s: float
) -> None:
    """The page draws the per-head stage while the head details are held back (whether the
    permalink came with it or its spinner's long poll fetched it); a head opened meanwhile
    waits for them, then the whole body replaces the first one with that head kept."""
    from app.routes import pages
    from model_worker.run import analyze as analyze_module

    monkeypatch.setattr(pages, "PAGE_WAIT_S", page_wait_s)

    stage = threading.Event()  # without a page wait: the per-head stage waits for the spinner
    real_sums = analyze_module.attention_sums

    def spinner_first(*args: Any, **kwargs: Any) -> Any:
        stage.wait(30)
        return real_sums(*args, **kwargs)

    if not page_wait_s:
        monkeypatch.setattr(analyze_module, "attention_sums", spinner_first)
    with held_head_details(monkeypatch), released(stage):
        page.goto(base_url + "/")
        demos = ["six : foo", "hate : bar", "two : foo"][:: 1 if page_wait_s else -1]
        page.fill("textarea[name=prompt]", " ".join([*demos, "one :"]))  # fresh each case
        page.click("#analyse")
        if not page_wait_s:
            spinner = "section.status[data-status=queued], section.status[data-status=running]"
            expect(page.locator(spinner)).to_be_visible()  # queued while the worker is busy
            stage.set()
        expect(page.locator(".analysis-body[data-status=heads]")).to_be_visible(timeout=30_000)
        expect(page.locator("[data-figure=heatmap] .cell")).to_have_count(12)
        expect(page.locator(".details-pending")).to_be_visible()
        page.locator(".vl-figure .cell[data-layer='1'][data-head='2']").click()
        expect(page.locator("#head-panel")).to_contain_text("on their way")
    expect(page.locator(".analysis-body[data-status=done]")).to_be_visible(timeout=30_000)
    expect(page.locator(".details-pending")).to_have_count(0)
    head = page.locator("#head-panel .head[data-head-name=L1H2]")
    expect(head).to_be_visible(timeout=30_000)
    expect(page.locator("table.top-heads th", has_text="MRR").first).to_be_visible()


def test_a_head_opened_while_the_finished_body_is_on_its_way_stays_open(
    page: Page, base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finished analysis' body is requested with the URL of that moment; a head opened
    before it arrives is opened again in the body that replaces the first one."""

    bodies: list[Route] = []  # the finished body's requests, held until the head is open

    def is_body(url: str) -> bool:
        return url.endswith("/status")  # the long polls carry ?wait=

    def hold(route: Route) -> None:
        bodies.append(route)

    page.route(is_body, hold)
    with held_head_details(monkeypatch) as release:
        page.goto(base_url + "/")
        page.fill("textarea[name=prompt]", "love : bar six : foo hate : bar one :")  # fresh
        page.click("#analyse")
        expect(page.locator(".details-pending")).to_be_visible(timeout=30_000)
        release.set()
        for _ in range(300):
            if bodies:
                break
            page.wait_for_timeout(100)
        assert bodies, "the finished body was never requested"
        page.locator(".vl-figure .cell[data-layer='1'][data-head='2']").click()
        expect(page.locator("#head-panel .head[data-head-name=L1H2]")).to_be_visible(timeout=30_000)
    for route in bodies:
        route.continue_()
    page.unroute(is_body)
    expect(page.locator(".analysis-body[data-status=done]")).to_be_visible(timeout=30_000)
    expect(page.locator(".details-pending")).to_have_count(0)
    expect(page.locator("#head-panel .head[data-head-name=L1H2]")).to_be_visible(timeout=30_000)


def test_a_head_whose_answer_comes_after_the_finished_body_stays_open(
    page: Page, base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other order: the head is clicked while the finished body is on its way, and the
    head's answer arrives after that body replaced the first one (into the old panel): the
    head is opened again in the new body's panel."""
    bodies: list[Route] = []
    heads: list[Route] = []
    page.route(lambda url: url.endswith("/status"), lambda route: bodies.append(route))
    page.route("**/heads/L1H2", lambda route: heads.append(route))
    with held_head_details(monkeypatch) as release:
        page.goto(base_url + "/")
        page.fill("textarea[name=prompt]", "sad : bar nine : foo love : bar one :")  # fresh
        page.click("#analyse")
        expect(page.locator(".details-pending")).to_be_visible(timeout=30_000)
        release.set()
        for _ in range(300):
            if bodies:
                break
            page.wait_for_timeout(100)
        assert bodies, "the finished body was never requested"
        page.locator(".vl-figure .cell[data-layer='1'][data-head='2']").click()
        for _ in range(100):
            if heads:
                break
            page.wait_for_timeout(100)
        assert heads, "the click asked for no head"
    page.unroute("**/heads/L1H2")
    for route in bodies:
        route.continue_()
    expect(page.locator(".analysis-body[data-status=done]")).to_be_visible(timeout=30_000)
    for route in heads:
        route.continue_()
    expect(page.locator("#head-panel .head[data-head-name=L1H2]")).to_be_visible(timeout=30_000)
    assert page.url.endswith("?head=L1H2")


def test_analyse_shows_it_is_busy_then_the_permalink(
    page: Page, base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Analyse is sent by htmx (no page load): while the permalink waits for the per-head
    stage the button is disabled and says so; then the page is the permalink's."""
    from app.routes import pages
    from model_worker.run import analyze as analyze_module

    monkeypatch.setattr(pages, "PAGE_WAIT_S", 30.0)
    stage = threading.Event()
    real_sums = analyze_module.attention_sums

    def held(*args: Any, **kwargs: Any) -> Any:
        stage.wait(30)
        return real_sums(*args, **kwargs)

    monkeypatch.setattr(analyze_module, "attention_sums", held)
    with released(stage):
        page.goto(base_url + "/")
        page.evaluate("window.__samePage = true")  # gone if the browser loads a new page
        page.fill("textarea[name=prompt]", "nine : foo awful : bar three : foo one :")  # fresh
        page.click("#analyse")
        expect(page.locator("#analyse")).to_be_disabled()
        expect(page.locator(".analyse-form .busy")).to_be_visible()
        stage.set()
        expect(page.locator("[data-figure=heatmap] .cell")).to_have_count(12, timeout=30_000)
    assert "/a/a-" in page.url and page.evaluate("window.__samePage === true")


def test_a_refused_analysis_shows_why_and_back_keeps_the_prompt(page: Page, base_url: str) -> None:
    """A refused form comes back with its reason and what was typed, at the same address; after
    an analysis, Back finds the prompt as it was typed."""
    page.goto(base_url + "/")
    typed = "seven : foo sad : bar four : foo one :"
    page.fill("textarea[name=prompt]", typed)
    page.fill("input[name=target]", "x" * 201)
    page.click("#analyse")
    expect(page.locator("p.error[role=alert]")).to_contain_text("target")
    assert page.url == base_url + "/"
    expect(page.locator("textarea[name=prompt]")).to_have_value(typed)
    page.goto(base_url + "/")  # the preset in the box; what is typed is only in the page
    typed = "three : foo awful : bar eight : foo one :"
    page.fill("textarea[name=prompt]", typed)
    page.select_option("select[name=norm]", "recompute")
    page.click("#analyse")
    expect(page.locator("[data-figure=heatmap] .cell")).to_have_count(12, timeout=30_000)
    page.go_back()
    expect(page.locator("textarea[name=prompt]")).to_have_value(typed)
    expect(page.locator("select[name=norm]")).to_have_value("recompute")
    assert page.url == base_url + "/"


def test_an_analyse_request_that_fails_on_the_way_is_sent_as_a_form(
    page: Page, base_url: str
) -> None:
    """A connection that breaks under htmx's request leaves no silent page: the form is sent
    again the ordinary way and the browser loads the permalink."""
    failed: list[str] = []

    def break_once(route: Route) -> None:
        if not failed and route.request.headers.get("hx-request"):
            failed.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    page.route("**/analyse", break_once)
    page.goto(base_url + "/")
    page.fill("textarea[name=prompt]", "two : foo good : bar nine : foo one :")  # fresh
    page.click("#analyse")
    expect(page.locator("[data-figure=heatmap] .cell")).to_have_count(12, timeout=30_000)
    assert failed and "/a/a-" in page.url
