"""Notebook results on SmolLM2 (CPU), the README's third line: `r = icl_heads.analyze(...)`,
then `r` displayed (`_repr_mimebundle_`: the static HTML, its figures plain SVG written in
Python, and the heatmap's Vega-Lite; target ≤ 0.1 s, computing nothing: analyses and vl-convert
drawings counted; the process' very first display, which also builds Altair's first chart, is
printed apart), then `r.head(name)`'s label-key tables: now from one forward pass,
before issue 40 from a whole analysis of the prompt with the head's keys (timed in the same
run, interleaved).

    PYTHONPATH=.:bench .venv/bin/python bench/bench_notebook.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import vl_convert
from machine import cpu_model

import icl_heads.local as local
from app.views.figure_kit.export import VL_VERSION
from app.views.figures.registry import FIGURES
from model_worker.run import analyze as engine_analyze

PAPER = "love : bar like : bar eight : foo two : foo one :"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; torch threads {torch.get_num_threads()}")
    loaded = local.load_model(None, device="cpu")
    calls = {"analyses": 0, "vl-convert drawings": 0}
    real = engine_analyze.analyze
    real_draw = vl_convert.vegalite_to_svg

    def counted(*a: object, **k: object) -> object:
        calls["analyses"] += 1
        return real(*a, **k)  # type: ignore[arg-type]

    def drawing(*a: object, **k: object) -> object:
        calls["vl-convert drawings"] += 1
        return real_draw(*a, **k)  # type: ignore[arg-type]

    vl_convert.vegalite_to_svg = drawing

    display, again, drawn, now, before = [], [], [], [], []
    for i in range(args.repeats + 1):
        result = local.analyze(loaded, PAPER)
        engine_analyze.analyze = counted  # type: ignore[assignment]
        start = time.perf_counter()
        result._repr_mimebundle_()
        display.append(time.perf_counter() - start)
        start = time.perf_counter()
        result._repr_mimebundle_()
        again.append(time.perf_counter() - start)
        engine_analyze.analyze = real
        figures = [FIGURES[name].build(result) for name in ("layers", "flow", "heatmap")]
        start = time.perf_counter()
        for figure in figures:  # what the display drew before: the figures by vl-convert
            real_draw(figure.spec("light", offscreen=True), vl_version=VL_VERSION)
        drawn.append(time.perf_counter() - start)
        name = result.top_heads[i % len(result.top_heads)]
        start = time.perf_counter()
        result.head(name)
        now.append(time.perf_counter() - start)
        start = time.perf_counter()
        real(loaded, PAPER, extra_heads=[name], label_keys=[name])  # the old head()
        before.append(time.perf_counter() - start)
    d, a, v, n, b = (statistics.median(x[1:]) for x in (display, again, drawn, now, before))
    print(
        f"display (_repr_mimebundle_), {len(result.tokens)} tokens: first {d * 1000:.0f} ms "
        f"(the process' very first {display[0] * 1000:.0f} ms), again {a * 1000:.1f} ms "
        f"(target ≤ 100); while displaying: "
        + ", ".join(f"{count} {what}" for what, count in calls.items())
        + f"; before (issue 40's first change): + its three figures by vl-convert {v * 1000:.0f} ms"
    )
    print(
        f"head(name) label keys: {n * 1000:.0f} ms from one forward pass, before "
        f"{b * 1000:.0f} ms (an analysis); before/now {b / n:.1f}× "
        f"(load {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
