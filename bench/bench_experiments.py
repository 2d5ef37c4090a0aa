"""Benchmark: experiment 2 (top-20 heads over the correct prompts) on SmolLM2, CPU.

Times the batched path (`heads.head_table`: batched forward passes + per-head increases of the
correctly answered prompts) on N prompts of sentiment-number, and the one-by-one baseline
(`analyze()` per prompt, target = the true label) on a subset, extrapolated linearly to N.
Prints both and their ratio, measured in this one run (other processes share the CPU).

`--designs` (issue 26) times instead the prompts per second of the paper's design (FFTT, the
design before counterbalancing) against the counterbalanced one, interleaved `--repeats` times:
batched forward passes over the same number of prompts, then, for the counterbalanced design,
the evidence computed from the runs (exact binomial and bootstrap intervals, per-arrangement
rows, the adequacy gate): "no regression per prompt" means the two rates agree within noise.

    .venv/bin/python bench/bench_experiments.py [--n 200] [--baseline 20] [--batch-size 16]
    .venv/bin/python bench/bench_experiments.py --designs [--n 96] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from machine import cpu_model

from model_worker.datasets import Dataset, load_builtin
from model_worker.experiments.batching import prepare, run_prompts
from model_worker.experiments.data import prompts
from model_worker.experiments.evidence import adequacy, by_arrangement, position_effect
from model_worker.experiments.heads import head_table
from model_worker.model.loading import LoadedModel, load_model
from model_worker.run.analyze import analyze


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--baseline", type=int, default=20, help="prompts analysed one by one")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--designs", action="store_true", help="FFTT vs counterbalanced")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    loaded = load_model()
    dataset = load_builtin("sentiment-number")
    print(f"CPU {cpu_model()}; load average {os.getloadavg()[0]:.2f}")
    if args.designs:
        return designs(loaded, dataset, args.n, args.batch_size, args.repeats)

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


def designs(loaded: LoadedModel, dataset: Dataset, n: int, batch_size: int, repeats: int) -> None:
    """Prompts per second, FFTT vs counterbalanced (+ evidence), interleaved `repeats` times."""
    rates: dict[str, list[float]] = {"fftt": [], "counterbalanced": []}
    evidence_s: list[float] = []
    for _ in range(repeats):
        for design in ("fftt", "counterbalanced"):
            items = prepare(loaded, prompts(dataset, n, 0, design=design))
            start = time.perf_counter()
            runs = run_prompts(loaded, items, batch_size=batch_size)
            if design == "counterbalanced":
                began = time.perf_counter()
                adequacy(runs, design)
                by_arrangement(runs)
                position_effect(runs)
                evidence_s.append(time.perf_counter() - began)
            rates[design].append(len(items) / (time.perf_counter() - start))
    for design, seen in rates.items():
        print(
            f"{design}: {statistics.median(seen):.1f} prompts/s median (runs: "
            f"{', '.join(f'{r:.1f}' for r in seen)}), {n} prompts, batch {batch_size}"
        )
    ratio = statistics.median(rates["counterbalanced"]) / statistics.median(rates["fftt"])
    print(
        f"counterbalanced (with its evidence) / FFTT: {ratio:.2f}x prompts per second (medians); "
        f"evidence {1000 * statistics.fmean(evidence_s) / n:.2f} ms per prompt"
    )


if __name__ == "__main__":
    main()
