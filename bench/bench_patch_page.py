"""Single-prompt patching as the web tier runs it: the submission check, the patching job (the
embedded backend's engine, `InProcessEngine.patch`), and what the pages cost the web tier — the
patching page's views and figure specifications for that result, and the atlas page's matrix
for a model-sized atlas (random scores over the model's heads: its size, not its numbers).
First, the patching job against one analysis of the same prompt (the paper's 14-token prompt,
both directions, the defaults), interleaved: the patched runs starting at their first patched
layer (now) and every layer run (before issue 40, `run_patched` without the base run); the
target is the patch page's results within 5× one analysis.

    PYTHONPATH=.:bench .venv/bin/python -u bench/bench_patch_page.py --directions denoising
"""

from __future__ import annotations

import argparse
import json
import os
import time
from functools import partial
from typing import Any

import numpy as np
import torch
from bench_analysis import prompt_of
from machine import cpu_model

from app.views.atlas_panels import AtlasPanel
from app.views.figures.atlas import matrix_figure
from app.views.patching_panels import PatchHeadPanel, PatchingPanel
from model_worker.common.settings import Settings
from model_worker.contracts.experiments import ExperimentResult
from model_worker.contracts.patching import DIRECTIONS, PatchRequest
from model_worker.model.loading import LoadedModel, load_model
from model_worker.service.in_process import InProcessEngine

SCORES = ("in_context", "label_share", "induction", "previous_token", "function_vector")
SCORES += ("saliency", "sink")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def timed(fn: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def synthetic_atlas(n_heads: int, n_layers: int) -> ExperimentResult:
    """An atlas result of the model's size with random scores (seed 0)."""
    rng = np.random.default_rng(0)
    values = {s: rng.normal(size=n_heads) for s in SCORES}
    ranks = {s: np.argsort(np.argsort(-values[s])) + 1 for s in SCORES}
    per_layer = n_heads // n_layers
    rows = []
    for i in range(n_heads):
        row: dict[str, Any] = {"name": f"L{i // per_layer}H{i % per_layer}"}
        row |= {"layer": i // per_layer, "head": i % per_layer}
        for s in SCORES:
            row |= {s: float(values[s][i]), f"{s}_rank": int(ranks[s][i])}
        rows.append(row)
    pairs = [(a, b) for i, a in enumerate(SCORES) for b in SCORES[i + 1 :]]
    correlations = [
        {"score_a": a, "score_b": b, "spearman": 0.1, "low": -0.1, "high": 0.3} for a, b in pairs
    ]
    return ExperimentResult.model_validate(
        {
            "name": "atlas",
            "model": "synthetic",
            "dataset": "synthetic",
            "n": 0,
            "seed": 0,
            "metrics": {"k": 4.0},
            "tables": {"atlas": rows, "atlas_correlations_prompts": correlations},
            "figures": {},
        }
    )


PAPER = "love : bar like : bar eight : foo two : foo one :"


def patch_against_analysis(loaded: LoadedModel, engine: InProcessEngine, repeats: int) -> None:
    """The patching job's seconds against one analysis', now and before (every layer run)."""
    from model_worker.contracts.analysis import AnalysisRequest
    from model_worker.patching import run as patching_run
    from model_worker.service.recent import RECENT

    request = PatchRequest(prompt=PAPER)
    analysis = AnalysisRequest(prompt=PAPER)
    now = patching_run.run_patched

    def before(*args: Any, base: Any = None, **kwargs: Any) -> Any:
        return now(*args, **kwargs)  # every layer of every row run

    def analyse() -> None:
        RECENT.clear()  # a whole analysis each time
        engine.analyze(loaded, analysis, lambda _: None)

    def patched() -> None:
        engine.patch(loaded, request, lambda *_: None)

    def unskipped() -> None:
        patching_run.run_patched = before  # type: ignore[assignment]
        try:
            engine.patch(loaded, request, lambda *_: None)
        finally:
            patching_run.run_patched = now

    times: dict[str, list[float]] = {"analysis": [], "patch": [], "before": []}
    patched()
    for _ in range(repeats):
        for name, run in (("analysis", analyse), ("patch", patched), ("before", unskipped)):
            times[name].append(timed(run)[1])
    a, p, b = (float(np.median(times[k])) for k in ("analysis", "patch", "before"))
    print(
        f"patching job, paper prompt (14 tokens), both directions: {p:.2f} s = {p / a:.1f}× one "
        f"analysis ({a:.2f} s; target ≤ 5×); before (every layer run) {b:.2f} s = {b / a:.1f}×; "
        f"before/now {b / p:.2f}× (load {os.getloadavg()[0]:.1f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--directions", choices=["both", *DIRECTIONS], default="denoising")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(device="cpu", dtype="float32")
    prompt = prompt_of(loaded, 64)
    directions = list(DIRECTIONS) if args.directions == "both" else [args.directions]
    request = PatchRequest(prompt=prompt, directions=directions)  # type: ignore[arg-type]
    engine = InProcessEngine(Settings(), loader=lambda: loaded)
    print(f"CPU {cpu_model()}; torch threads {args.threads}; load {os.getloadavg()[0]:.1f}")
    patch_against_analysis(loaded, engine, args.repeats)
    _, first = timed(lambda: engine.check_patch(loaded, request))
    _, again = timed(lambda: engine.check_patch(loaded, request))
    print(f"submission check: {ms(first)} first (copies the tokenizer), then {ms(again)}")
    result, job = timed(lambda: engine.patch(loaded, request, lambda *_: None))
    print(
        f"patching job, {loaded.name}, {len(result.tokens)} tokens, {args.directions}, top_k "
        f"{request.top_k}, {request.qkv_heads} q/k/v heads: {job:.1f} s "
        f"(load {os.getloadavg()[0]:.1f}); result JSON "
        f"{len(result.model_dump_json()) / 1024:.0f} KiB"
    )
    direction = result.directions[0]
    job_id = "p-" + "0" * 32
    panel, views = timed(lambda: PatchingPanel.of(job_id, result, direction))
    figures = panel.heatmaps + panel.figures
    specs, spec_s = timed(lambda: [json.dumps(f.spec("light")) for f in figures])
    name = direction.positions[0].name
    head = PatchHeadPanel.of(job_id, result, direction, name)
    assert head is not None and head.figure is not None
    head_spec, head_s = timed(lambda: json.dumps(head.figure.spec("light")))  # type: ignore[union-attr]
    print(
        f"patching page: views {ms(views)}, {len(figures)} specs {ms(spec_s)} "
        f"({sum(map(len, specs)) / 1024:.0f} KiB); head panel spec {ms(head_s)} "
        f"({len(head_spec) / 1024:.0f} KiB)"
    )
    g = loaded.geometry
    atlas = synthetic_atlas(g.n_layers * g.n_heads, g.n_layers)
    for _ in range(2):  # the second: Altair's imports and caches warm
        figure, build = timed(lambda: matrix_figure(atlas))
        assert figure is not None
        spec, spec_s = timed(partial(lambda f: json.dumps(f.spec("light")), figure))
        _, table = timed(lambda: AtlasPanel.of(job_id, atlas, "induction", None, False))
    print(
        f"atlas page, {g.n_layers * g.n_heads} heads: matrix {ms(build)} + spec {ms(spec_s)} "
        f"({len(spec) / 1024:.0f} KiB); sorted table {ms(table)} (load {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
