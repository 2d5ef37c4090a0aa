"""Activation patching vs a forward pass on SmolLM2 (CPU, fp32), the README's 64-token prompt.

Prints, measured in one run (medians of --repeats interleaved rounds after a warm-up): a
plain forward pass; the attribution patching of every head and position in one direction
(the clean run recorded as the source, then one forward and one backward pass of the
corrupted run); exact patching of 20 heads batched (one row per head, and the recorded
source); the atlas experiment's throughput in prompts per second (--atlas N prompts).
Targets (issue 27): attribution ≤ 4× a forward pass, exact patching of 20 heads ≤ 25×.

    PYTHONPATH=.:bench .venv/bin/python bench/bench_patching.py [--repeats 5] [--atlas 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from bench_analysis import prompt_of
from machine import cpu_model

from model_worker.contracts.experiments import ExperimentRequest
from model_worker.contracts.patching import PatchRequest
from model_worker.experiments.job import run_experiment
from model_worker.model.loading import load_model
from model_worker.patching.engine import Patch, attribution, record, run_patched
from model_worker.patching.run import make_pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--atlas", type=int, default=8, help="atlas prompts (0: skip)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: as set)")
    args = parser.parse_args()
    if args.threads:  # 1 on a loaded shared machine: no thread waits on a descheduled peer
        torch.set_num_threads(args.threads)
    loaded = load_model(device="cpu", dtype="float32")
    prompt = prompt_of(loaded, args.tokens)
    pair = make_pair(loaded, PatchRequest(prompt=prompt), max_tokens=4096)
    ids = pair.clean.ids[None]
    g = loaded.geometry
    threads = torch.get_num_threads()
    print(f"model {loaded.name}, prompt {ids.shape[1]} tokens, torch threads {threads}")
    print(f"CPU {cpu_model()}; load average {os.getloadavg()[0]:.2f}")
    print(f"corrupted (swap-labels): {len(pair.corrupted.texts)} tokens, target {pair.target!r}")

    def forward() -> None:
        with torch.inference_mode():
            loaded.model(ids)

    def attribution_run() -> None:
        source = record(loaded, pair.clean.ids)
        attribution(loaded, pair.corrupted.ids, source, pair.target_id, pair.other_id)

    estimate = attribution(
        loaded, pair.corrupted.ids, pair.clean_run, pair.target_id, pair.other_id
    )
    flat = estimate.z.sum(1).abs().flatten()
    top = flat.argsort(descending=True)[:20].tolist()
    rows = [[Patch("z", i // g.n_heads, i % g.n_heads)] for i in top]

    def attribution_only() -> None:
        """The attribution pass alone: `patch()` records both runs for the pair anyway."""
        attribution(loaded, pair.corrupted.ids, pair.clean_run, pair.target_id, pair.other_id)

    def exact_run() -> None:
        source = record(loaded, pair.clean.ids)
        run_patched(loaded, pair.corrupted.ids, source, rows)

    runs = {
        "forward": forward,
        "attribution": attribution_run,
        "attribution_only": attribution_only,
        "exact20": exact_run,
    }
    timings: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():  # warm-up
        run()
    for _ in range(args.repeats):  # interleaved: a load change hits every kind alike
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            timings[name].append(time.perf_counter() - start)
    results = {name: statistics.median(values) for name, values in timings.items()}
    base = results["forward"]
    print(f"forward pass                         {base * 1000:8.1f} ms   1.00×")
    print(
        f"attribution, all heads (one dir.)    {results['attribution'] * 1000:8.1f} ms  "
        f"{results['attribution'] / base:5.2f}×  (target ≤ 4×)"
    )
    print(
        f"  the pass alone (source recorded)   {results['attribution_only'] * 1000:8.1f} ms  "
        f"{results['attribution_only'] / base:5.2f}×"
    )
    print(
        f"exact patching, 20 heads batched     {results['exact20'] * 1000:8.1f} ms  "
        f"{results['exact20'] / base:5.2f}×  (target ≤ 25×)"
    )
    if args.atlas:
        request = ExperimentRequest(name="atlas", dataset="sentiment-number", n=args.atlas)
        start = time.perf_counter()
        run_experiment(loaded, request, batch_size=8)
        seconds = time.perf_counter() - start
        print(
            f"atlas experiment, n = {args.atlas}: {seconds:.1f} s, "
            f"{args.atlas / seconds:.3f} prompts/s (function vectors and saliency on "
            f"min(n, 16) prompts, 5 accuracy passes)"
        )
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
