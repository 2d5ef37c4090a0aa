"""Figures a speaker can put on a slide, in Chromium: prompts of about 12, 66 and 300 tokens at
1440×900 and 1280×720, in normal and presentation mode, and at 1920×1080 in presentation mode.
Every drawn figure's smallest text is at least 11 px (15 px in presentation), no page scrolls
sideways, a heatmap cell's hover shows its head, Enter on a focused cell opens it, tokens keep
their characters, and the page's CSP reports nothing. The `auto` theme draws dark figures on a
dark system. A forged experiment result full of markup is shown as inert text (24.2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from app.main import create_app
from app.store import open_store
from app.views.figure_kit.themes import config
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.contracts.experiments import ExperimentRequest, ExperimentResult
from model_worker.contracts.figures import FigureData, FigureSeries
from model_worker.datasets.prompts import format_prompt
from model_worker.service.queue.result_parts import BODY, experiment_parts
from tests.browser.figure_prompts import EXTRA, prompt, tiny_words
from tests.browser.live import serve

pytestmark = pytest.mark.browser
#: records every CSP report of the page (set before any of its scripts runs)
CSP_LISTENER = (
    "window.__csp = [];"
    "document.addEventListener('securitypolicyviolation',"
    " e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));"
)
#: the smallest rendered font size (px) of every text of every drawn figure, and where
SMALLEST_TEXT = """() => {
  let smallest = 1e9, where = "";
  for (const host of document.querySelectorAll(".vl-figure[data-drawn=true]")) {
    const svg = host.querySelector("svg");
    const scale = svg.getBoundingClientRect().width / svg.width.baseVal.value;
    for (const text of svg.querySelectorAll("text")) {
      if (!text.textContent.trim() || text.getBoundingClientRect().width === 0) continue;
      const px = parseFloat(getComputedStyle(text).fontSize) * scale;
      if (px < smallest) { smallest = px; where = host.dataset.figure + ": " + text.textContent; }
    }
  }
  return [smallest, where];
}"""
FORGED_ID = "e-" + "f" * 32
MARKUP = (
    '<button hx-post="/logout" hx-trigger="load">x</button>'
    '<meta http-equiv="refresh" content="0;url=/login">'
    "<svg onload=alert(1)><script>alert(2)</script></svg><img src=x onerror=alert(3)>"
)


REPORT_MARKDOWN = f"# Report\n\n{MARKUP}\n\n[login](/logout)"


def forged_experiment() -> ExperimentResult:
    """An experiment result a forger wrote: markup in every text a view shows."""
    figure = FigureData(
        kind="bars",
        title=MARKUP,
        y_label=MARKUP,
        categories=[MARKUP, "b"],
        series=[FigureSeries(name=MARKUP, values=[0.5, 0.25])],
    )
    return ExperimentResult.model_validate(
        {
            "name": "accuracy",
            "model": "tiny-words",
            "dataset": "sentiment-number",
            "n": 2,
            "seed": 0,
            "metrics": {"accuracy": 0.5},
            "tables": {"cells": [{"label": MARKUP, "accuracy": 0.5}]},
            "figures": {"accuracy": figure.model_dump()},
            "report_markdown": REPORT_MARKDOWN,
        }
    )


@pytest.fixture(scope="module")
def words_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = Settings(model="tiny-words", data_dir=Path(tmp_path_factory.mktemp("store")))
    store = open_store(settings)
    body = json.loads(experiment_parts(forged_experiment())[BODY])
    body["figures"]["legacy"] = f'<svg xmlns="http://www.w3.org/2000/svg">{MARKUP}</svg>'
    del body["report"]  # as schema 7 stored it: a Markdown report
    body["report_markdown"] = REPORT_MARKDOWN
    request = ExperimentRequest(name="accuracy", dataset="sentiment-number").model_dump_json()
    store.remember(FORGED_ID, "experiment", "tiny-words", "fp", request)  # parts need a row
    store.save(FORGED_ID, {BODY: json.dumps(body).encode()})  # as schema 5 stored SVG
    app = create_app(settings, embedded_backend(settings, loader=tiny_words, store=store))
    with serve(app) as url:
        yield url


#: where the heatmap's card starts on the page (px from the page's top)
HEATMAP_TOP = """() => document.querySelector(".panel-heatmap").getBoundingClientRect().top
  + window.scrollY"""


def open_page(browser: Browser, size: tuple[int, int], present: bool) -> Page:
    context = browser.new_context(viewport={"width": size[0], "height": size[1]})
    page = context.new_page()
    page.add_init_script(CSP_LISTENER)
    page.errors = []  # type: ignore[attr-defined]
    page.on("pageerror", lambda e: page.errors.append(str(e)))  # type: ignore[attr-defined]
    return page


@pytest.mark.parametrize("n_tokens", [12, 66, 300])
@pytest.mark.parametrize(
    ("size", "present"),
    [
        ((1440, 900), False),
        ((1440, 900), True),
        ((1280, 720), False),
        ((1280, 720), True),
        ((1920, 1080), True),  # a projector
    ],
    ids=["1440-normal", "1440-present", "1280-normal", "1280-present", "1920-present"],
)
def test_figures_are_readable_at_every_prompt_length(
    browser: Browser,
    words_url: str,
    artifacts: Path,
    n_tokens: int,
    size: tuple[int, int],
    present: bool,
) -> None:
    page = open_page(browser, size, present)
    page.goto(words_url + ("/prefs?present=1&next=/" if present else "/"))
    page.fill("textarea[name=prompt]", prompt(n_tokens))
    page.click("#analyse")
    expect(page.locator(".analysis-body[data-status=done]")).to_be_visible(timeout=60_000)
    heatmap = page.locator(".vl-figure[data-figure=heatmap][data-drawn=true]")
    expect(heatmap).to_be_visible(timeout=30_000)
    if n_tokens <= 66:  # the first screen shows the heatmap's start, presentation mode too
        top = page.evaluate(HEATMAP_TOP)
        assert top < 0.8 * size[1], f"the heatmap starts at {top:.0f} px"
    cell = heatmap.locator(".cell").first
    cell.hover()  # the hover names the head and its split
    expect(page.locator("#vg-tooltip-element.visible")).to_contain_text("label / other")
    cell.focus()
    page.keyboard.press("Enter")  # the keyboard opens a head as a click does
    expect(page.locator("#head-panel .head")).to_be_visible(timeout=30_000)
    drawn = page.locator("#head-panel .vl-figure[data-drawn=true]")
    expect(drawn).to_have_count(4, timeout=30_000)  # attention, scores, increase, margin
    page.mouse.move(0, 0)
    tag = f"{n_tokens}-{size[0]}x{size[1]}{'-present' if present else ''}"
    page.screenshot(path=artifacts / f"figures-{tag}.png", full_page=False)
    page.locator("#head-panel .head-figures").screenshot(path=artifacts / f"head-{tag}.png")
    smallest, where = page.evaluate(SMALLEST_TEXT)
    assert smallest >= (15 if present else 11) - 0.01, where
    assert page.evaluate("document.documentElement.scrollWidth") <= size[0]
    attention = page.locator("#head-panel .vl-figure[data-figure=attention] svg")
    if n_tokens >= 66:
        for word in EXTRA[:2]:  # the emoji and the CJK word, as themselves
            expect(attention.locator("text", has_text=word).first).to_be_attached()
    assert page.evaluate("window.__csp") == []
    assert page.errors == []  # type: ignore[attr-defined]
    page.context.close()


#: how far the top-heads table overflows its card (0: it fits)
TABLE_OVERFLOW = """() => {
  const card = document.querySelector(".panel-top-heads");
  return card.scrollWidth - card.clientWidth;
}"""


@pytest.mark.parametrize("size", [(1440, 900), (1280, 720)], ids=["1440", "1280"])
def test_the_top_heads_table_fits_its_card_with_long_label_words(
    browser: Browser, words_url: str, artifacts: Path, size: tuple[int, int]
) -> None:
    """Two long label words make two wide MRR columns: the table's column widens (the
    figures' gives way) instead of scrolling in its card (before: cut at 1440 × 900 with
    SmolLM2's "positive" / "negative", at 1280 × 720 even after tighter cells)."""
    words = ("alligator", "alpaca", "antelope", "armadillo", "baboon", "badger", "beaver", "bear")
    demos = [(w, "enthusiastic" if i % 2 else "disappointing") for i, w in enumerate(words)]
    page = open_page(browser, size, present=False)
    page.goto(words_url + "/")
    page.fill("textarea[name=prompt]", format_prompt(demos, "bat"))
    page.click("#analyse")
    expect(page.locator(".analysis-body[data-status=done]")).to_be_visible(timeout=60_000)
    expect(page.locator("table.top-heads th", has_text="disappointing")).to_be_visible()
    page.screenshot(path=artifacts / f"top-heads-long-labels-{size[0]}.png", full_page=False)
    assert page.evaluate(TABLE_OVERFLOW) <= 1
    assert page.evaluate("document.documentElement.scrollWidth") <= size[0]
    page.context.close()


#: the colour of the heatmap's axis labels (the theme's text colour) and its figure's theme
AXIS_TEXT = """() => {
  const host = document.querySelector(".vl-figure[data-figure=heatmap][data-drawn=true]");
  const label = host.querySelector("svg g.mark-text.role-axis-label text");
  return [host.dataset.theme, label.getAttribute("fill"),
          host.closest("figure").querySelector("a.download[data-format=svg]").href];
}"""


@pytest.mark.parametrize("scheme", ["dark", "light"])
def test_the_auto_theme_follows_the_systems_colour_scheme(
    browser: Browser, words_url: str, artifacts: Path, scheme: str
) -> None:
    """A page in the `auto` theme (the default) on a dark system draws its figures dark (the
    dark theme's text, and the downloads in the dark theme too); on a light one, light."""
    context = browser.new_context(
        viewport={"width": 1440, "height": 900},
        color_scheme=scheme,  # type: ignore[arg-type]
    )
    page = context.new_page()
    page.add_init_script(CSP_LISTENER)
    page.goto(words_url + "/")
    assert page.evaluate("document.documentElement.dataset.theme") == "auto"
    page.fill("textarea[name=prompt]", prompt(12))
    page.click("#analyse")
    expect(page.locator(".analysis-body[data-status=done]")).to_be_visible(timeout=60_000)
    expect(page.locator(".vl-figure[data-figure=heatmap][data-drawn=true]")).to_be_visible(
        timeout=30_000
    )
    theme, fill, download = page.evaluate(AXIS_TEXT)
    if scheme == "dark":
        assert (theme, fill) == ("dark", config("dark")["axis"]["labelColor"])
        assert "theme=dark" in download
        page.screenshot(path=artifacts / "auto-dark.png", full_page=False)
    else:
        assert (theme, fill) == ("light", config("light")["axis"]["labelColor"])
        assert "theme=light" in download
    # the system switches while the page is open: the figures follow
    other = "light" if scheme == "dark" else "dark"
    page.emulate_media(color_scheme=other)  # type: ignore[arg-type]
    expect(page.locator(f".vl-figure[data-figure=heatmap][data-theme={other}]")).to_have_count(1)
    expect(page.locator(".vl-figure[data-figure=heatmap][data-drawn=true]")).to_be_visible(
        timeout=30_000
    )
    theme, fill, download = page.evaluate(AXIS_TEXT)
    assert (theme, fill) == (other, config(other)["axis"]["labelColor"])  # type: ignore[index]
    assert f"theme={other}" in download
    assert page.evaluate("window.__csp") == []
    context.close()


def test_a_forged_experiment_shows_its_markup_as_text(
    browser: Browser, words_url: str, artifacts: Path
) -> None:
    page = open_page(browser, (1440, 900), False)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    posted: list[str] = []
    page.on("request", lambda r: posted.append(r.url) if r.method != "GET" else None)
    page.goto(f"{words_url}/e/{FORGED_ID}")
    figure = page.locator(".vl-figure[data-figure=accuracy][data-drawn=true]")
    expect(figure).to_be_visible(timeout=30_000)
    expect(figure.locator("svg text", has_text="<button").first).to_be_attached()
    expect(page.locator("[data-report]")).to_contain_text('<meta http-equiv="refresh"')
    page.wait_for_timeout(1500)  # a meta refresh or an hx-trigger=load would have fired
    page.screenshot(path=artifacts / "forged-experiment.png", full_page=True)
    assert page.url == f"{words_url}/e/{FORGED_ID}"
    assert dialogs == [] and posted == []
    assert page.locator("button[hx-post], meta[http-equiv], img[src=x]").count() == 0
    assert page.locator("[data-report] a[href]").count() == 0  # no links from a worker
    assert page.locator("[data-figure=legacy]").count() == 0  # stored SVG is never shown
    assert page.evaluate("window.__csp") == []
    page.context.close()
