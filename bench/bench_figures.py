"""Figures: server-side cost per figure and the weight of the pages that draw them.

For prompts of about 12, 66 and 300 tokens (a tiny random model over the datasets' words:
tests/browser/figure_prompts.py; the figures' size depends on the prompt, not the model), prints
per figure, medians of `--repeats` runs measured in this one run:
- build: the Vega-Lite specification built from the result (Altair), as the page embeds it;
- spec: its JSON size (what the page carries inline for the browser to draw);
- svg / png: vl-convert drawing it off-screen (what a download costs the render pool);
and the weight of the analysis page (HTML) and a head panel, with the vendored scripts the
browser loads once (Vega, Vega-Lite, vega-embed), raw and gzipped.

    PYTHONPATH=. .venv/bin/python bench/bench_figures.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import statistics
import sys
import time
from pathlib import Path

from fastapi.testclient import TestClient

from app.main import create_app
from app.views.figure_kit.export import draw
from app.views.figures.registry import FIGURES
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.run.analyze import analyze
from tests.browser.figure_prompts import prompt, tiny_words

sys.path.insert(0, os.path.dirname(__file__))
from machine import cpu_model  # noqa: E402

STATIC = Path(__file__).resolve().parents[1] / "static"
SCRIPTS = [
    "vendor/vega-6.2.0.min.js",
    "vendor/vega-lite-6.4.1.min.js",
    "vendor/vega-embed-7.1.0.min.js",
    "js/figures.js",
]
FIGURES_SHOWN = ["heatmap", "layers", "flow", "attention", "scores", "increase", "margin"]


def median_ms(action: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()  # type: ignore[operator]
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def kb(n: int) -> str:
    return f"{n / 1024:.0f} KB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}")
    loaded = tiny_words()
    draw({"mark": "point", "data": {"values": [{}]}}, "svg")  # vl-convert's one-time start
    print(f"{'tokens':>6} {'figure':<10} {'build':>8} {'spec':>8} {'svg':>8} {'png':>8}")
    for n in (12, 66, 300):
        result = analyze(loaded, prompt(n))
        detail = result.head_details[result.top_heads[0]]
        for name in FIGURES_SHOWN:
            entry = FIGURES[name]
            args_of = (result,) if entry.kind == "analysis" else (result, detail)

            def build(entry=entry, args_of=args_of):  # type: ignore[no-untyped-def]
                figure = entry.build(*args_of)
                return figure, figure.spec("light")

            figure, spec = build()
            size = len(str(spec).encode())
            offscreen = figure.spec("light", offscreen=True)
            build_ms = median_ms(build, args.repeats)
            svg_ms = median_ms(lambda s=offscreen: draw(s, "svg"), args.repeats)
            png_ms = median_ms(lambda s=offscreen: draw(s, "png"), args.repeats)
            print(
                f"{len(result.tokens):>6} {name:<10} {build_ms:>6.1f}ms {kb(size):>8}"
                f" {svg_ms:>6.0f}ms {png_ms:>6.0f}ms"
            )
    settings = Settings(model="tiny-words")
    app = create_app(settings, embedded_backend(settings, loader=tiny_words))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        for n in (12, 66, 300):
            answer = client.post("/analyse", data={"prompt": prompt(n)}, follow_redirects=False)
            while answer.status_code == 503:  # the model is still loading: asked again
                time.sleep(float(answer.headers.get("Retry-After", "1")))
                answer = client.post("/analyse", data={"prompt": prompt(n)}, follow_redirects=False)
            page_url = answer.headers["location"]
            while 'data-status="done"' not in client.get(page_url + "/status").text:
                time.sleep(0.1)
            html = client.get(page_url).text
            top = re.search(r'<tr data-head-name="(L\d+H\d+)"', html)
            head = client.get(f"{page_url}/heads/{top[1] if top else 'L0H0'}").text
            print(
                f"{n:>4}-token page: analysis HTML {kb(len(html.encode()))} "
                f"(gzip {kb(len(gzip.compress(html.encode())))}), head panel "
                f"{kb(len(head.encode()))} (gzip {kb(len(gzip.compress(head.encode())))})"
            )
    raw = sum((STATIC / s).stat().st_size for s in SCRIPTS)
    zipped = sum(len(gzip.compress((STATIC / s).read_bytes())) for s in SCRIPTS)
    print(f"figure scripts, loaded once and cached: {kb(raw)} (gzip {kb(zipped)})")


if __name__ == "__main__":
    main()
