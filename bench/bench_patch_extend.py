"""Adding a head to a finished patch vs patching whole with it, on SmolLM2 (CPU, fp32).

Prints, measured in one run (medians of --repeats interleaved rounds after the stored patch is
computed once), for a head of the first layer (its rows run every layer: the dearest) and one
of the middle layer (its rows start there): patching whole with that head also patched per
position, and `extend()` adding it to the stored result (the pair recorded, one attribution
pass when the head's per-position estimates are not stored, the head's rows); the rows each
runs through the model and the ratio of their times. Target (issue 37): adding a middle-layer
head costs under half the whole patch on the README's 64-token prompt (ratio ≥ 2×).

    PYTHONPATH=.:bench .venv/bin/python bench/bench_patch_extend.py [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from bench_analysis import prompt_of
from machine import cpu_model

from model_worker.contracts.patching import PatchRequest
from model_worker.model.loading import load_model
from model_worker.patching.extend import extend
from model_worker.patching.run import patch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: as set)")
    parser.add_argument("--directions", choices=["both", "denoising"], default="denoising")
    args = parser.parse_args()
    if args.threads:  # 1 on a loaded shared machine: no thread waits on a descheduled peer
        torch.set_num_threads(args.threads)
    loaded = load_model(device="cpu", dtype="float32")
    directions = ["denoising", "noising"] if args.directions == "both" else ["denoising"]
    request = PatchRequest(prompt=prompt_of(loaded, args.tokens), directions=directions)
    started = time.perf_counter()
    base = patch(loaded, request, 4096)
    stored_s = time.perf_counter() - started
    have = {item.name for item in base.directions[0].positions}
    middle = loaded.geometry.n_layers // 2
    heads = {
        where: next(
            h.name for h in base.directions[0].heads if h.exact is None and h.layer == layer
        )
        for where, layer in (("first layer", 0), ("middle layer", middle))
    }
    print(
        f"model {loaded.name}, prompt {len(base.tokens)} tokens, directions {directions}, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"CPU {cpu_model()}; load average {os.getloadavg()[0]:.2f}")
    print(f"the stored patch: {stored_s:.1f} s; adding {heads} (none exactly patched)")

    rows: list[int] = []

    def count(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        rows.append(int(kwargs["input_ids"].shape[0]))

    loaded.model.register_forward_pre_hook(count, with_kwargs=True)
    runs: dict[str, Callable[[], object]] = {}
    for where, head in heads.items():
        added = request.model_copy(update={"heads": [*have, head]})
        runs[f"whole, {where}"] = functools.partial(patch, loaded, added, 4096)
        runs[f"extend, {where}"] = functools.partial(extend, loaded, base, added, 4096)
    timings: dict[str, list[float]] = {name: [] for name in runs}
    counted: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, run in runs.items():
            rows.clear()
            started = time.perf_counter()
            run()
            timings[name].append(time.perf_counter() - started)
            counted[name] = sum(rows)
    for where, head in heads.items():
        whole = statistics.median(timings[f"whole, {where}"])
        part = statistics.median(timings[f"extend, {where}"])
        print(
            f"{where} ({head}): whole {whole:.2f} s, {counted[f'whole, {where}']} rows; "
            f"extend {part:.2f} s, {counted[f'extend, {where}']} rows; "
            f"ratio {whole / part:.2f}×" + (" (target ≥ 2×)" if where == "middle layer" else "")
        )


if __name__ == "__main__":
    main()
