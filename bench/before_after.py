"""Before / after the move to Vega-Lite, interleaved in one run (bench_browser.py --before TREE).

Each checkout is served by its own process (bench/tree_server.py: a SmolLM2-shaped random
Llama, 270 heads, so both pay the same small compute) and the same Chromium drives both, the
order alternating every round (ABBA). Printed, per commit (median, max over the rounds):

- click Analyse → heatmap painted, and → the finished body (head details) painted with its
  heatmap, cache cold (a new prompt each round), on the already loaded home page;
- a cold navigation (new browser context, empty HTTP cache) to a finished analysis'
  permalink → first contentful paint and → heatmap painted; the same with a warm cache;
- page weight of that navigation: every response's bytes, and gzipped (level 6);
- server time of the page's HTML, a head panel, and each figure's SVG download (first
  request for a new analysis: nothing cached), through HTTP.

"Painted": a task posted from the first animation frame after the marker entered the DOM
(it runs after that frame's paint): `[data-figure=heatmap] .cell` (the server's SVG before;
after, the server's preview SVG, and Vega's drawn cells for "drawn by Vega").
"""

from __future__ import annotations

import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

from playwright.sync_api import Browser, Page

from tests.browser.live import free_port

HERE = Path(__file__).resolve().parent
WORDS = ["love", "like", "hate", "good", "bad", "eight", "two", "three", "four", "five"]
LABELS = {"love": "bar", "like": "bar", "hate": "bar", "good": "bar", "bad": "bar"}

PROBE = """
(() => {
  const now = () => performance.now();
  const marks = (window.__m = {});
  document.addEventListener("click", (e) => {
    if (e.target && e.target.id === "analyse") marks.click = now();
  }, true);
  const seen = (key, selector) => {
    if (marks[key] === undefined && document.querySelector(selector)) {
      marks[key] = now();
      // painted: a task posted from the next animation frame runs after that frame's paint
      requestAnimationFrame(() => setTimeout(() => { marks[key + "_frame"] = now(); }, 0));
    }
  };
  new MutationObserver(() => {
    seen("card", "[data-figure=heatmap]");
    seen("heatmap", "[data-figure=heatmap] .cell");
    seen("drawn", "[data-figure=heatmap] svg:not(.vl-preview) .cell");
    seen("details", ".analysis-body[data-status=done] [data-figure=heatmap] .cell");
  }).observe(document, { childList: true, subtree: true, attributes: true });
})();
"""


def prompt(tokens: int, shift: int) -> str:
    """A word-classification prompt of about `tokens` word tokens; `shift` makes it new."""
    order = WORDS[shift % len(WORDS) :] + WORDS[: shift % len(WORDS)]
    demos: list[str] = []
    while 3 * (len(demos) + 1) + 2 <= tokens:
        word = order[(len(demos) * (shift + 3)) % len(order)]
        demos.append(f"{word} : {LABELS.get(word, 'foo')}")
    return " ".join([*demos, "one :"])


@contextmanager
def tree_server(tree: Path) -> Iterator[str]:
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="bench-tree-"))
    log = open(data / "server.log", "w")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, str(HERE / "tree_server.py"), str(tree), str(port), str(data)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/", timeout=2)
                break
            except OSError as error:
                if process.poll() is not None:
                    stopped = f"{tree}: the server stopped ({data / 'server.log'})"
                    raise RuntimeError(stopped) from error
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()


def wait_mark(page: Page, mark: str) -> float:
    page.wait_for_function(
        "m => window.__m && window.__m[m + '_frame'] !== undefined", arg=mark, polling=10,
        timeout=300_000,
    )  # fmt: skip
    return float(page.evaluate(f"window.__m.{mark}_frame"))


def analyse(page: Page, url: str, text: str) -> tuple[float, float, float, float, str]:
    """ms from the click to the heatmap's card in the DOM (the server's answer), to the
    heatmap painted (its first paint: after, the server's preview SVG), to it drawn by Vega
    (before: the server's SVG again) and to the finished body painted; the permalink."""
    page.goto(url + "/")
    page.fill("textarea[name=prompt]", text)
    page.click("#analyse")
    heatmap = wait_mark(page, "heatmap")
    drawn = wait_mark(page, "drawn")
    details = wait_mark(page, "details")
    click = float(page.evaluate("window.__m.click"))
    card = float(page.evaluate("window.__m.card"))
    return card - click, heatmap - click, drawn - click, details - click, page.url.split("?")[0]


def navigate(page: Page, permalink: str) -> tuple[float, float, float, int, int]:
    """A navigation to a finished analysis: ms to first contentful paint, to the heatmap
    painted and to it drawn by Vega; bytes of all responses and their gzipped size."""
    bodies: list[bytes] = []

    def keep(response: object) -> None:
        with suppress(Exception):  # a redirect has no body
            bodies.append(response.body())  # type: ignore[attr-defined]

    page.on("response", keep)
    page.goto(permalink, wait_until="load")
    heatmap = wait_mark(page, "heatmap")
    drawn = wait_mark(page, "drawn")
    fcp = float("nan")
    for _ in range(100):
        paints = dict(
            page.evaluate("performance.getEntriesByType('paint').map(e => [e.name, e.startTime])")
        )
        if "first-contentful-paint" in paints:
            fcp = float(paints["first-contentful-paint"])
            break
        page.wait_for_timeout(20)
    page.remove_listener("response", keep)
    timing = page.evaluate(
        "(([n]) => [n.responseEnd, n.domInteractive, n.domContentLoadedEventEnd])"
        "(performance.getEntriesByType('navigation'))"
    )
    page.__dict__["timing"] = timing
    raw = sum(len(b) for b in bodies)
    zipped = sum(len(gzip.compress(b, 6)) for b in bodies)
    return fcp, heatmap, drawn, raw, zipped


def timed_get(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=300) as response:
        response.read()
    return (time.perf_counter() - start) * 1000


def server_times(permalink: str, head: str) -> dict[str, float]:
    """ms the server takes for the page, a head panel and each figure's SVG (first request)."""
    base, job = permalink.rsplit("/a/", 1)
    times = {"page HTML": timed_get(permalink), f"head panel ({head})": timed_get(
        f"{permalink}/heads/{head}"
    )}  # fmt: skip
    for name in ("heatmap", "layers", "flow"):
        times[f"{name}.svg"] = timed_get(f"{base}/figures/{job}/{name}.svg")
    for name in ("attention", "scores", "increase"):
        times[f"head {name}.svg"] = timed_get(f"{base}/figures/{job}/heads/{head}/{name}.svg")
    return times


def top_head(page: Page) -> str:
    name = page.locator("table.top-heads tbody tr a").first.inner_text()
    return name.strip()


def run(browser: Browser, trees: dict[str, Path], rounds: int, tokens: int) -> None:
    """Prints the comparison (see the module's docstring)."""
    with ExitStack() as stack:
        urls = {label: stack.enter_context(tree_server(tree)) for label, tree in trees.items()}
        labels = list(urls)
        results: dict[str, dict[str, list[float]]] = {label: {} for label in labels}

        def add(label: str, key: str, value: float) -> None:
            results[label].setdefault(key, []).append(value)

        context = browser.new_context(viewport={"width": 1440, "height": 900})
        context.add_init_script(PROBE)
        page = context.new_page()
        for label in labels:  # warm-up: each server's model loaded, Chromium's JIT, fonts
            analyse(page, urls[label], prompt(tokens, 99))
        for r in range(rounds):
            order = labels if r % 2 == 0 else labels[::-1]
            for label in order:
                card, heatmap, drawn, details, permalink = analyse(
                    page, urls[label], prompt(tokens, r)
                )
                add(label, "click → heatmap's card in the DOM (ms)", card)
                add(label, "  card in the DOM → heatmap painted (ms)", heatmap - card)
                add(label, "  card in the DOM → heatmap drawn by Vega (ms)", drawn - card)
                add(label, "click → heatmap painted (ms)", heatmap)
                add(label, "click → heatmap drawn by Vega (ms)", drawn)
                add(label, "click → details painted (ms)", details)
                cold = browser.new_context(viewport={"width": 1440, "height": 900})
                cold.add_init_script(PROBE)
                fresh = cold.new_page()
                fcp, painted, drawn, raw, zipped = navigate(fresh, permalink)
                add(label, "cold permalink → first contentful paint (ms)", fcp)
                add(label, "cold permalink → heatmap painted (ms)", painted)
                add(label, "cold permalink → heatmap drawn by Vega (ms)", drawn)
                last_byte, parsed, loaded = fresh.__dict__["timing"]
                add(label, "cold permalink → HTML's last byte (ms)", last_byte)
                add(label, "cold permalink → parsed, DOM interactive (ms)", parsed)
                add(label, "cold permalink → DOMContentLoaded end (ms)", loaded)
                add(label, "page HTML (KB)", len(urllib.request.urlopen(permalink).read()) / 1024)
                add(label, "page weight, raw (KB)", raw / 1024)
                add(label, "page weight, gzip (KB)", zipped / 1024)
                fcp, painted, drawn, _, _ = navigate(fresh, permalink)
                add(label, "warm permalink → first contentful paint (ms)", fcp)
                add(label, "warm permalink → heatmap painted (ms)", painted)
                add(label, "warm permalink → heatmap drawn by Vega (ms)", drawn)
                cold.close()
                # server times on another new analysis (nothing drawn or cached for it yet)
                *_, other = analyse(page, urls[label], prompt(tokens, 1000 + r))
                for key, value in server_times(other, top_head(page)).items():
                    add(label, f"server: {key} (ms)", value)
        context.close()

    keys = list(results[labels[0]])
    width = max(len(k) for k in keys)
    print(f"{'':<{width}}  " + "  ".join(f"{label:>22}" for label in labels))
    for key in keys:
        cells = []
        for label in labels:
            values = results[label][key]
            cells.append(f"{statistics.median(values):9.0f} (max {max(values):7.0f})")
        print(f"{key:<{width}}  " + "  ".join(f"{c:>22}" for c in cells))


def main(
    browser_factory: Callable[[], Browser],
    before: Path,
    rounds: int,
    tokens: int,
    after: Path | None = None,
) -> None:
    """`after`: a checkout of the commit to measure (default: this working tree)."""
    after = after or Path(__file__).resolve().parents[1]
    print(f"before: {before} ({git_rev(before)}); after: {after} ({git_rev(after)})")
    print(f"prompt ≈ {tokens} tokens; {rounds} rounds, order alternating (ABBA)")
    run(browser_factory(), {"before": before, "after": after}, rounds, tokens)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def git_rev(tree: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
