"""The figure screenshots of the docs and the README, drawn by Chromium from a live server.

    PYTHONPATH=. .venv/bin/python scripts/figure_screenshots.py [--model tiny] [--out docs/images]

With SmolLM2 (the default; ~1 min to load on a CPU): the paper's prompt with its top head open
(1440×900), a ~300-token prompt's head panel (1440×900), and the `layers` experiment
(n = 8) in presentation mode, dark (1280×720): its first figure and its verdicts.
`--model tiny` draws the same pages with a tiny random model (tests/browser/figure_prompts.py),
for a quick look at the layout.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect, sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.main import create_app  # noqa: E402
from icl_heads.serving import embedded_backend  # noqa: E402
from model_worker.common.settings import Settings  # noqa: E402
from tests.browser.figure_prompts import prompt, tiny_words  # noqa: E402
from tests.browser.live import launch, serve  # noqa: E402

PAPER_PROMPT = "love : bar like : bar eight : foo two : foo one :"


def analyse(page: Page, url: str, text: str) -> None:
    """Analyses `text` from the home page (again while the model still loads: 503)."""
    for _ in range(120):
        page.goto(url + "/")
        page.fill("textarea[name=prompt]", text)
        page.click("#analyse")
        try:
            page.wait_for_url("**/a/a-*", timeout=5_000)
            break
        except PlaywrightError:
            continue
    expect(page.locator(".analysis-body[data-status=done]")).to_be_visible(timeout=300_000)
    expect(page.locator(".vl-figure[data-figure=heatmap][data-drawn=true]")).to_be_visible()


def open_top_head(page: Page) -> None:
    page.locator("table.top-heads a.head-link").first.click()
    drawn = page.locator("#head-panel .vl-figure[data-drawn=true]")
    expect(drawn.first).to_be_visible(timeout=300_000)
    page.wait_for_timeout(800)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tiny = args.model == "tiny"
    settings = Settings(
        data_dir=Path(tempfile.mkdtemp()), **({"model": "tiny-words"} if tiny else {})
    )
    app = create_app(settings, embedded_backend(settings, loader=tiny_words if tiny else None))
    with serve(app, timeout=600) as url, sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        started = time.monotonic()
        analyse(page, url, PAPER_PROMPT)
        open_top_head(page)
        page.locator(".analysis-body .grid").first.scroll_into_view_if_needed()
        page.screenshot(path=args.out / "figures-paper-prompt.png")
        analyse(page, url, prompt(300))
        open_top_head(page)
        page.locator("#head-panel .head-figures").screenshot(
            path=args.out / "figures-300-token-head.png"
        )
        dark = browser.new_page(viewport={"width": 1280, "height": 720})
        dark.goto(url + "/prefs?present=1&next=/experiments")
        dark.goto(url + "/prefs?theme=dark&next=/experiments")
        dark.check("input[name=name][value=layers]")
        dark.fill("input[name=n]", "8")
        dark.click("form button[type=submit]")
        figure = dark.locator(".vl-figure[data-drawn=true]").first
        expect(figure).to_be_visible(timeout=600_000)
        dark.wait_for_timeout(800)
        figure.screenshot(path=args.out / "figures-experiment-presentation-dark.png")
        verdicts = dark.locator("[data-panel=verdicts]")
        if verdicts.count():  # the evidence view: hypotheses, rules, intervals, verdicts
            verdicts.screenshot(path=args.out / "figures-experiment-verdicts-dark.png")
        print(f"screenshots in {args.out} ({time.monotonic() - started:.0f} s)")
        browser.close()


if __name__ == "__main__":
    main()
