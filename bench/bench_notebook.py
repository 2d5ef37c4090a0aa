"""Notebook results on SmolLM2 (CPU), the README's third line: `r = icl_heads.analyze(...)`,
then `r` displayed (`_repr_mimebundle_`: the static HTML and the heatmap's Vega-Lite; target
≤ 0.1 s, computing nothing), then `r.head(name)`'s label-key tables: now from one forward pass,
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
from machine import cpu_model

import icl_heads.local as local
from model_worker.run import analyze as engine_analyze

PAPER = "love : bar like : bar eight : foo two : foo one :"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; torch threads {torch.get_num_threads()}")
    loaded = local.load_model(None, device="cpu")
    calls = {"analyses": 0}
    real = engine_analyze.analyze

    def counted(*a: object, **k: object) -> object:
        calls["analyses"] += 1
        return real(*a, **k)  # type: ignore[arg-type]

    display, again, now, before = [], [], [], []
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
        name = result.top_heads[i % len(result.top_heads)]
        start = time.perf_counter()
        result.head(name)
        now.append(time.perf_counter() - start)
        start = time.perf_counter()
        real(loaded, PAPER, extra_heads=[name], label_keys=[name])  # the old head()
        before.append(time.perf_counter() - start)
    d, a, n, b = (statistics.median(x[1:]) for x in (display, again, now, before))
    print(
        f"display (_repr_mimebundle_), {len(result.tokens)} tokens: first {d * 1000:.0f} ms "
        f"(its three figures drawn to SVG), again {a * 1000:.1f} ms (target ≤ 100); "
        f"{calls['analyses']} analyses run while displaying"
    )
    print(
        f"head(name) label keys: {n * 1000:.0f} ms from one forward pass, before "
        f"{b * 1000:.0f} ms (an analysis); before/now {b / n:.1f}× "
        f"(load {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
