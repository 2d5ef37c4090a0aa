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

from model_worker.analyze import analyze
from model_worker.datasets import load_builtin
from model_worker.experiments.data import prompts
from model_worker.experiments.heads import head_table
from model_worker.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--baseline", type=int, default=20, help="prompts analysed one by one")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    loaded = load_model()
    dataset = load_builtin("sentiment-number")

    start = time.perf_counter()
    runs, mean = head_table(
        loaded, dataset, args.n, 0, batch_size=args.batch_size, progress=lambda *_: None
    )
    batched = time.perf_counter() - start
    correct = sum(r.correct for r in runs)

    subset = prompts(dataset, args.baseline, 0)
    start = time.perf_counter()
    for prompt in subset:
        analyze(loaded, prompt.text, target=prompt.true_label)
    one_by_one = (time.perf_counter() - start) / len(subset) * args.n

    print(f"batched experiment-2 core, {args.n} prompts ({correct} correct): {batched:.1f} s")
    print(
        f"analyze() one by one: {one_by_one:.1f} s for {args.n} prompts "
        f"(timed on {len(subset)}, extrapolated linearly)"
    )
    print(f"speed-up: {one_by_one / batched:.1f}x; within 3 minutes: {batched <= 180}")


if __name__ == "__main__":
    main()
