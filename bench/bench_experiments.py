"""Benchmark: experiment 2 (top-20 heads over the correct prompts) on SmolLM2, CPU.

Times the batched path (`heads.head_table`: batched forward passes + per-head increases of the
correctly answered prompts) on N prompts of sentiment-number, and the one-by-one baseline
(`analyze()` per prompt, target = the true label) on a subset, extrapolated linearly to N.
Prints both and their ratio, measured in this one run (other processes share the CPU).

    .venv/bin/python bench/bench_experiments.py [--n 200] [--baseline 20] [--batch-size 16]
"""

from __future__ import annotations

import argparse
import time

from model_worker.datasets import load_builtin
from model_worker.experiments.data import prompts
from model_worker.experiments.heads import head_table
from model_worker.loading import load_model
from model_worker.run.analyze import analyze


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--baseline", type=int, default=20, help="prompts analysed one by one")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    loaded = load_model()
    dataset = load_builtin("sentiment-number")

    start, cpu = time.perf_counter(), time.process_time()
    runs, mean = head_table(
        loaded, dataset, args.n, 0, batch_size=args.batch_size, progress=lambda *_: None
    )
    batched, batched_cpu = time.perf_counter() - start, time.process_time() - cpu
    correct = sum(r.correct for r in runs)

    subset = prompts(dataset, args.baseline, 0)
    start, cpu = time.perf_counter(), time.process_time()
    for prompt in subset:
        analyze(loaded, prompt.text, target=prompt.true_label)
    scale = args.n / len(subset)
    one_by_one = (time.perf_counter() - start) * scale
    one_by_one_cpu = (time.process_time() - cpu) * scale

    print(
        f"batched experiment-2 core, {args.n} prompts ({correct} correct): "
        f"{batched:.1f} s wall, {batched_cpu:.1f} s CPU"
    )
    print(
        f"analyze() one by one: {one_by_one:.1f} s wall, {one_by_one_cpu:.1f} s CPU for "
        f"{args.n} prompts (timed on {len(subset)}, extrapolated linearly)"
    )
    print(
        f"speed-up: {one_by_one / batched:.1f}x wall, {one_by_one_cpu / batched_cpu:.1f}x CPU; "
        f"within 3 minutes (wall): {batched <= 180}; mean mean-increase {float(mean.mean()):.4f}"
    )


if __name__ == "__main__":
    main()
