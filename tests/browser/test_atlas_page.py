"""The head atlas page in a real browser: an `atlas` experiment on the tiny model, then its page
from the experiment's link: the scatter matrix draws, the table sorts by a column (and back),
a head opens its panel from the table (by mouse and by keyboard: the table is one Tab stop)
and from a point of the matrix."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.browser
HEADS = 12  # the tiny llama: 3 layers × 4 heads


def atlas_job(page: Page, base_url: str) -> str:
    asked = {"name": "atlas", "dataset": "sentiment-number", "n": 6}
    job_id = str(page.request.post(f"{base_url}/api/experiments", data=asked).json()["id"])
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        state = page.request.get(f"{base_url}/api/analyses/{job_id}").json()
        if state["status"] in ("done", "failed"):
            assert state["status"] == "done", state
            return job_id
        time.sleep(0.5)
    raise AssertionError("the atlas experiment did not finish")


def column(page: Page, key: str) -> list[float]:
    cells = page.locator(f"table.atlas-table tbody td[data-col={key}]").all_inner_texts()
    return [float(text) if text != "—" else float("nan") for text in cells]


def test_the_atlas_sorts_and_opens_a_head(page: Page, base_url: str, artifacts: Path) -> None:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("response", lambda r: errors.append(r.url) if r.status >= 400 else None)
    page.set_viewport_size({"width": 1440, "height": 900})
    job_id = atlas_job(page, base_url)
    page.goto(f"{base_url}/e/{job_id}")
    page.click("a[data-atlas-link]")
    matrix = page.locator(".vl-figure[data-figure=matrix]")
    expect(matrix).to_have_attribute("data-drawn", "true", timeout=30_000)
    expect(page.locator("table.atlas-table tbody tr")).to_have_count(HEADS)
    expect(page.locator("[data-resampled=prompts]")).to_have_count(1)  # intervals over prompts
    first = column(page, "in_context")
    assert first == sorted(first, reverse=True)  # by the in-context score, highest first
    page.screenshot(path=artifacts / "atlas.png", full_page=True)

    page.click("a.sort-link[data-sort=induction]")
    expect(page.locator("#atlas-table[data-sort=induction][data-order=desc]")).to_have_count(1)
    induction = column(page, "induction")
    assert induction == sorted(induction, reverse=True) and induction != first
    assert "sort=induction" in page.url
    page.click("a.sort-link[data-sort=induction]")  # again: lowest first
    expect(page.locator("#atlas-table[data-sort=induction][data-order=asc]")).to_have_count(1)
    assert column(page, "induction") == sorted(induction)

    # the table is one Tab stop: ↓ / End move between its heads, Enter opens one (issue 39)
    links = page.locator("table.atlas-table tbody a.head-link")
    expect(page.locator("table.atlas-table tbody a.head-link[tabindex='0']")).to_have_count(1)
    links.first.focus()
    page.keyboard.press("ArrowDown")
    expect(links.nth(1)).to_be_focused()
    page.keyboard.press("End")
    expect(links.nth(HEADS - 1)).to_be_focused()
    page.keyboard.press("Home")
    page.keyboard.press("ArrowDown")
    second = links.nth(1).inner_text()
    page.keyboard.press("Enter")
    expect(page.locator(f"#head-panel .atlas-head[data-head={second}]")).to_be_visible(
        timeout=30_000
    )
    expect(page.locator("#head-panel .atlas-head h2")).to_be_focused()

    name = page.locator("table.atlas-table tbody tr").first.get_attribute("data-head-name")
    page.locator("table.atlas-table tbody tr").first.locator("a.head-link").click()
    panel = page.locator(f"#head-panel .atlas-head[data-head={name}]")
    expect(panel).to_be_visible(timeout=30_000)
    expect(panel.locator("tbody tr")).to_have_count(7)  # every score
    assert f"head={name}" in page.url

    page.goto(f"{base_url}/e/{job_id}/atlas")  # no head open
    matrix = page.locator(".vl-figure[data-figure=matrix]")
    expect(matrix).to_have_attribute("data-drawn", "true", timeout=30_000)
    expect(page.locator("#head-panel .atlas-head")).to_have_count(0)
    matrix.locator("g.points_marks path").first.click(force=True)
    expect(page.locator("#head-panel .atlas-head")).to_have_count(1, timeout=30_000)
    page.wait_for_function("() => /[?&]head=L\\d+H\\d+/.test(location.search)")
    page.screenshot(path=artifacts / "atlas-head.png", full_page=False)
    assert errors == []
