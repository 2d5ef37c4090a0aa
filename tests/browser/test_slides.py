"""Every click lands where the eye is, and every figure fits a slide (issue 39), in Chromium at
1440×900 and 1280×720, normal and presentation (dark): an opened head's panel comes into view
with the focus on its heading, after a click and after Enter, and Back returns; the heatmap is
one Tab stop with arrow keys; no figure's text leaves its drawing (titles wrap), thinned axis
labels never touch, no page scrolls sideways, a head-panel PNG is as wide as on screen, in the
page's theme; an unknown analysis id is a plain 404 page."""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from app.main import create_app
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from tests.browser.figure_prompts import prompt, tiny_words
from tests.browser.live import serve

pytestmark = pytest.mark.browser
SIZES = [((1440, 900), False), ((1440, 900), True), ((1280, 720), False), ((1280, 720), True)]
IDS = ["1440-normal", "1440-present", "1280-normal", "1280-present"]
#: every drawn figure's text that leaves its drawing or its card, and thinned axis labels
#: (labelOverlap) that touch their neighbour: [figure, text] pairs
ESCAPED_TEXT = """() => {
  const found = [];
  for (const host of document.querySelectorAll(".vl-figure[data-drawn=true]")) {
    const svg = host.querySelector(".vl-view > svg");
    if (!svg) continue;
    const box = svg.getBoundingClientRect();
    const card = host.getBoundingClientRect();
    for (const text of svg.querySelectorAll("text")) {
      const r = text.getBoundingClientRect();
      if (!text.textContent.trim() || r.width === 0 || text.closest("[opacity='0']")) continue;
      if (getComputedStyle(text).opacity === "0" || text.getAttribute("opacity") === "0") continue;
      const out = r.left < box.left - 1 || r.right > box.right + 1 || r.left < card.left - 1
        || r.right > card.right + 1;
      if (out) found.push([host.dataset.figure, text.textContent]);
    }
    for (const axis of svg.querySelectorAll("g.role-axis-label")) {
      const shown = [...axis.querySelectorAll("text")].filter(
        t => t.getAttribute("opacity") !== "0" && t.textContent.trim()
          && !(t.getAttribute("transform") || "").includes("rotate"));
      const rects = shown.map(t => t.getBoundingClientRect()).sort((a, b) => a.left - b.left);
      for (let i = 1; i < rects.length; i++) {
        const sameRow = Math.abs(rects[i].top - rects[i - 1].top) < 2;
        if (sameRow && rects[i].left < rects[i - 1].right + 1) {
          const texts = shown.map(t => t.textContent).join(" ");
          found.push([host.dataset.figure, "labels touch: " + texts]);
          break;
        }
      }
    }
  }
  return found;
}"""


@pytest.fixture(scope="module")
def slides_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = Settings(model="tiny-words", data_dir=Path(tmp_path_factory.mktemp("slides")))
    app = create_app(settings, embedded_backend(settings, loader=tiny_words))
    with serve(app) as url:
        yield url


def analysed(browser: Browser, url: str, size: tuple[int, int], present: bool) -> Page:
    """A page of `size` (presentation and dark when `present`) showing a 66-token analysis."""
    page = browser.new_context(viewport={"width": size[0], "height": size[1]}).new_page()
    page.goto(
        url + ("/prefs?present=1&theme=dark&next=/" if present else "/prefs?theme=light&next=/")
    )
    page.fill("textarea[name=prompt]", prompt(66))
    page.click("#analyse")
    expect(page.locator(".analysis-body[data-status=done]")).to_be_visible(timeout=60_000)
    heatmap = page.locator(".vl-figure[data-figure=heatmap][data-drawn=true]")
    expect(heatmap).to_be_visible(timeout=30_000)
    return page


def heading_in_view(page: Page) -> None:
    """The head panel's heading has the focus and is on screen."""
    heading = page.locator("#head-panel .head-title h2")
    expect(heading).to_be_focused(timeout=30_000)
    box = heading.bounding_box()
    height = page.viewport_size["height"] if page.viewport_size else 0
    assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= height, box


@pytest.mark.parametrize(("size", "present"), SIZES, ids=IDS)
def test_an_opened_head_is_in_view_and_focused_and_back_returns(
    browser: Browser, slides_url: str, artifacts: Path, size: tuple[int, int], present: bool
) -> None:
    page = analysed(browser, slides_url, size, present)
    link = page.locator("table.top-heads a.head-link").nth(2)
    name = link.inner_text()
    link.scroll_into_view_if_needed()
    before = page.evaluate("scrollY")
    link.click()
    expect(page.locator(f"#head-panel .head[data-head-name={name}]")).to_have_count(1)
    heading_in_view(page)
    tag = f"{size[0]}{'-present' if present else ''}"
    page.screenshot(path=artifacts / f"slides-head-opened-{tag}.png")
    page.go_back()
    expect(page.locator("#head-panel .head")).to_have_count(0)
    page.wait_for_function(f"() => Math.abs(scrollY - {before}) < 4")
    expect(page.locator(f"table.top-heads a.head-link:text-is('{name}')")).to_be_focused()

    cell = page.locator(".vl-figure[data-figure=heatmap] .cell[tabindex='0']")
    cell.focus()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("Enter")  # L1H0
    expect(page.locator("#head-panel .head[data-head-name=L1H0]")).to_have_count(1)
    heading_in_view(page)
    assert page.evaluate("document.documentElement.scrollWidth") <= size[0]
    page.context.close()


def test_the_heatmap_is_one_tab_stop_with_arrow_keys(browser: Browser, slides_url: str) -> None:
    page = analysed(browser, slides_url, (1440, 900), False)
    cells = page.locator(".vl-figure[data-figure=heatmap] .cell")
    expect(cells).to_have_count(24)  # 6 layers × 4 heads
    stops = page.locator(".vl-figure[data-figure=heatmap] .cell[tabindex='0']")
    expect(stops).to_have_count(1)
    stops.focus()
    focused = ".vl-figure .cell:focus"

    def at() -> tuple[str | None, str | None]:
        here = page.locator(focused)
        return here.get_attribute("data-layer"), here.get_attribute("data-head")

    assert at() == ("0", "0")
    expect(page.locator(focused)).to_have_attribute(
        "aria-label", re.compile(r"^L0H0: layer 0, head 0, increase [+-]\d")
    )
    for key, where in [
        ("ArrowRight", ("1", "0")),
        ("ArrowDown", ("1", "1")),
        ("ArrowDown", ("1", "2")),
        ("ArrowLeft", ("0", "2")),
        ("ArrowLeft", ("0", "2")),  # the edge: stays
        ("End", ("5", "2")),
        ("PageDown", ("5", "3")),
        ("ArrowUp", ("5", "2")),
        ("Home", ("0", "2")),
        ("PageUp", ("0", "0")),
    ]:
        page.keyboard.press(key)
        assert at() == where, key
    page.keyboard.press("ArrowDown")
    expect(stops).to_have_count(1)  # still one Tab stop: the cell moved to
    page.keyboard.press("Tab")  # out of the heatmap in one press
    assert (
        page.evaluate("!!document.activeElement.closest('.vl-figure[data-figure=heatmap]')")
        is False
    )
    page.keyboard.press("Shift+Tab")  # back: onto the cell last moved to
    assert at() == ("0", "1")
    page.context.close()


def png_width(data: bytes) -> int:
    """A PNG's width in pixels (its IHDR chunk)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int(struct.unpack(">I", data[16:20])[0])


@pytest.mark.parametrize(("size", "present"), SIZES, ids=IDS)
def test_every_figure_fits_its_slide(
    browser: Browser, slides_url: str, artifacts: Path, size: tuple[int, int], present: bool
) -> None:
    """The analysis' figures and a head's: no text outside its drawing or card, no touching
    axis labels, no sideways scroll; a head figure's PNG as wide as it is on screen (2× pixels)
    and in the page's theme."""
    page = analysed(browser, slides_url, size, present)
    page.locator(".vl-figure[data-figure=heatmap] .cell[tabindex='0']").focus()
    page.keyboard.press("Enter")
    drawn = page.locator("#head-panel .vl-figure[data-drawn=true]")
    expect(drawn).to_have_count(4, timeout=30_000)
    page.wait_for_timeout(300)  # the downloads' widths are set once drawn
    tag = f"{size[0]}{'-present' if present else ''}"
    page.screenshot(path=artifacts / f"slides-figures-{tag}.png", full_page=True)
    assert page.evaluate(ESCAPED_TEXT) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= size[0]
    if present:  # the hidden columns are said to be hidden
        expect(page.locator("[data-hidden-columns]")).to_be_visible()
    else:
        expect(page.locator("[data-hidden-columns]")).to_be_hidden()
    theme = "presentation-dark" if present else "light"
    for name in ("attention", "increase"):
        figure = page.locator(f"#head-panel figure[data-figure={name}]")
        shown = figure.locator(".vl-view > svg").bounding_box()
        href = figure.locator("a.download[data-format=png]").get_attribute("href") or ""
        assert f"theme={theme}" in href and "width=" in href, href
        png = page.request.get(slides_url + href)
        assert png.ok, png.status
        assert shown is not None
        width = png_width(png.body()) / 2  # drawn at 2×
        assert abs(width - shown["width"]) <= max(8, 0.02 * shown["width"]), (name, width, shown)
    page.context.close()


def test_an_unknown_analysis_id_is_a_plain_404_page(page: Page, slides_url: str) -> None:
    for path in ("/a/nonsense", "/a/a-" + "0" * 32, "/p/x", "/e/e-zz"):
        answer = page.goto(slides_url + path)
        assert answer is not None and answer.status == 404, path
        expect(page.locator("h1")).to_have_text("Not found")
        assert "pattern" not in page.content() and "string_pattern" not in page.content()
    api = page.request.get(slides_url + "/api/analyses/nonsense")  # the API names the pattern
    assert api.status == 422 and "pattern" in api.text()


#: per drawn bar figure: [figure, its categories, the category labels it shows]
BAR_LABELS = """() => [...document.querySelectorAll(".vl-figure[data-drawn=true]")].map(host => {
  const spec = JSON.parse(host.dataset.spec);
  const layers = spec.layer || [spec];
  const x = (layers[0].encoding || {}).x || {};
  if (x.field !== "category") return null;
  const values = [...new Set((spec.data.values || []).map(r => r.category))];
  const axis = host.querySelector("g.role-axis.x, g[aria-label^='X-axis']") || host;
  const shown = [...axis.querySelectorAll("g.role-axis-label text")].filter(
    t => t.getAttribute("opacity") !== "0" && t.textContent.trim());
  return [host.dataset.figure, values.length, shown.length];
}).filter(Boolean)"""


@pytest.mark.parametrize(("size", "present"), [SIZES[3], SIZES[0]], ids=[IDS[3], IDS[0]])
def test_an_experiment_page_has_a_heading_every_bar_label_and_no_sideways_scroll(
    browser: Browser, base_url: str, artifacts: Path, size: tuple[int, int], present: bool
) -> None:
    page = browser.new_context(viewport={"width": size[0], "height": size[1]}).new_page()
    view = "present=1&theme=dark" if present else "present=0&theme=light"
    page.goto(f"{base_url}/prefs?{view}&next=/")
    asked = {"name": "ablation", "dataset": "sentiment-number", "n": 6}
    job_id = str(page.request.post(f"{base_url}/api/experiments", data=asked).json()["id"])
    page.goto(f"{base_url}/e/{job_id}")
    expect(page.locator(".experiment-result[data-status=done]")).to_be_visible(timeout=180_000)
    figures = page.locator(".experiment-result .vl-figure")
    expect(figures.first).to_have_attribute("data-drawn", "true", timeout=30_000)
    page.wait_for_timeout(500)
    heading = page.locator("h1[data-page-title]")
    expect(heading).to_contain_text("ablation")
    box = heading.bounding_box()
    assert box is not None and box["y"] < 200  # at the page's top
    page.screenshot(path=artifacts / f"slides-experiment-{size[0]}.png", full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth") <= size[0]
    assert page.evaluate(ESCAPED_TEXT) == []
    bars = page.evaluate(BAR_LABELS)
    assert bars, "no bar figure"
    for name, n_categories, shown in bars:
        assert shown == n_categories, (name, n_categories, shown)
    page.context.close()


@pytest.mark.parametrize(("size", "present"), [SIZES[3], SIZES[2]], ids=[IDS[3], IDS[2]])
def test_the_patching_and_compare_figures_fit_their_slide(
    browser: Browser, slides_url: str, artifacts: Path, size: tuple[int, int], present: bool
) -> None:
    """The patching page's figures (the two heatmaps, agreement, sites, q/k/v) and the compare
    page's (both heatmaps and their difference) at 1280 × 720."""
    page = analysed(browser, slides_url, size, present)
    first = page.url
    if present:  # presentation mode folds the tools under one line
        page.get_by_text("Compare or patch…").click()
    form = page.locator("form[data-patch-against]")
    form.locator("select[name=corruption]").select_option("swap-labels")
    form.locator("button[type=submit]").click()
    for name in ("effects", "direct", "agreement"):
        expect(page.locator(f".vl-figure[data-figure={name}]")).to_have_attribute(
            "data-drawn", "true", timeout=120_000
        )
    page.wait_for_timeout(500)
    tag = f"{size[0]}{'-present' if present else ''}"
    page.screenshot(path=artifacts / f"slides-patching-{tag}.png", full_page=True)
    assert page.evaluate(ESCAPED_TEXT) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= size[0]

    page.goto(slides_url + "/")
    page.fill("textarea[name=prompt]", prompt(12))
    page.click("#analyse")
    expect(page.locator(".analysis-body[data-status=done]")).to_be_visible(timeout=60_000)
    if present:
        page.get_by_text("Compare or patch…").click()
    page.fill("form[data-compare-with] input[name=b]", first)
    page.click("form[data-compare-with] button[type=submit]")
    expect(page.locator(".compare-body[data-status=done]")).to_be_visible(timeout=60_000)
    drawn = page.locator(".compare-body .vl-figure[data-drawn=true]")
    expect(drawn.first).to_be_visible(timeout=30_000)
    page.wait_for_timeout(500)
    page.screenshot(path=artifacts / f"slides-compare-{tag}.png", full_page=True)
    assert page.evaluate(ESCAPED_TEXT) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= size[0]
    page.context.close()
