"""What an analysis spends outside its maths: the full analysis against a replay of exactly its
products (the capturing forward pass and every vocabulary product, on the same inputs, through
the same kernels), interleaved in one run; the difference is the work around the maths
(element-wise passes over the logits, top-k lists, ranks, moving results to the host, building
and validating the result). Issue 29's target: that difference ≤ 10% of the analysis at 62 and
512 tokens, on the CPU.

    PYTHONPATH=. .venv/bin/python bench/bench_replay.py [--tokens 62 512] [--repeats 5]
    PYTHONPATH=. .venv/bin/python bench/bench_replay.py --details [--tokens 512]

`--details`: the details stage (the analysis minus its per-head stage) with the label-key
tables computed on demand (the default: none) against all of them computed
(`label_keys="all"`, as before issue 29), interleaved, and each one's products.

The replay records one analysis (after two warm-ups, so that recurring heads' U_h are kept as
a served worker keeps them): every call of `run_with_cache` in `model_worker.run.analyze` and
every product through `model_worker.analysis.kernels.kernel_for` (the unembedding products,
U_h built and used), with their inputs; replaying them runs those calls again, back to back.
It also counts the writes whose increases the Taylor expansion settled without a product
(`model_worker/analysis/taylor.py`; CPU, recurring heads). The expansion makes products of its
own over the vocabulary (`taylor.centred_gram`, V · d² multiply-adds a head, in place of the
writes' products): the replay runs them too, and the share is also printed without them (a
third interleaved run, the replay without its Gram products).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from machine import cpu_model

import model_worker.analysis.details as details_module
import model_worker.analysis.kernels as kernels
import model_worker.analysis.taylor as taylor
import model_worker.run.analyze as analyze_module
from model_worker.analysis.taylor import SmallWrites
from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze


@dataclass
class Recorded:
    """The captures (args, kwargs) and products (x, w, kernel) of the analyses run while
    recording."""

    captures: list[tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    products: list[tuple[torch.Tensor, torch.Tensor, kernels.Kernel]] = field(default_factory=list)
    settled: list[tuple[int, int]] = field(default_factory=list)  # (settled, writes) per call
    grams: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def rows(self) -> int:
        """Rows multiplied in all: the products' left operands' rows."""
        return sum(int(x.shape[0]) for x, _, _ in self.products)

    def gflop(self) -> float:
        """The products' floating-point operations (2 · N · V · D each), in GFLOP."""
        return sum(2 * x.shape[0] * w.shape[0] * x.shape[1] for x, w, _ in self.products) / 1e9

    def gram_gflop(self) -> float:
        """The expansion's Gram products' floating-point operations (2 · V · d² each)."""
        return sum(2 * u.shape[0] * u.shape[1] ** 2 for u, _, _ in self.grams) / 1e9


@contextmanager
def recording() -> Iterator[Recorded]:
    """Record every capture and vocabulary product the analyses run inside make."""
    found = Recorded()
    real_capture, real_kernel_for = analyze_module.run_with_cache, kernels.kernel_for
    real_small_writes, real_gram = details_module.small_writes, taylor.centred_gram

    def capture(*args: Any, **kwargs: Any) -> Any:
        found.captures.append((args, kwargs))
        return real_capture(*args, **kwargs)

    def kernel_for(x: torch.Tensor, w: torch.Tensor, kept: bool = False) -> kernels.KernelChoice:
        choice = real_kernel_for(x, w, kept)
        found.products.append((x, w, choice.kernel))
        return choice

    def small_writes(**kwargs: Any) -> SmallWrites:
        small = real_small_writes(**kwargs)
        found.settled.append((int(small.done.sum()), small.done.numel()))
        return small

    def centred_gram(u: torch.Tensor, mean: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        found.grams.append((u, mean, p))
        return real_gram(u, mean, p)

    analyze_module.run_with_cache = capture  # type: ignore[assignment]
    kernels.kernel_for = kernel_for  # type: ignore[assignment]
    details_module.small_writes = small_writes
    taylor.centred_gram = centred_gram
    try:
        yield found
    finally:
        analyze_module.run_with_cache = real_capture  # type: ignore[assignment]
        kernels.kernel_for = real_kernel_for  # type: ignore[assignment]
        details_module.small_writes = real_small_writes
        taylor.centred_gram = real_gram


def replay(recorded: Recorded, grams: bool = True) -> None:
    """The recorded captures and products again, back to back (their results dropped); with
    `grams`, the Taylor expansion's Gram products too (`taylor.centred_gram`: products over the
    vocabulary, V · d² multiply-adds each, in place of the writes' own products)."""
    for args, kwargs in recorded.captures:
        analyze_module.run_with_cache(*args, **kwargs)
    for x, w, kernel in recorded.products:
        kernel(x, w)
    for u, mean, p in recorded.grams if grams else ():
        taylor.centred_gram(u, mean, p)


def recorded_analysis(loaded: LoadedModel, prompt: str, **options: Any) -> Recorded:
    """One analysis of `prompt`, recorded (its result dropped)."""
    with recording() as found:
        analyze(loaded, prompt, **options)
    return found


def interleaved(
    runs: dict[str, Callable[[], object]], repeats: int, sync: Callable[[], None]
) -> dict[str, float]:
    """Median wall seconds of each run, alternating them (after one warm-up each); `sync`
    waits for the device after each run (CUDA), so that its time counts."""
    walls: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()
        sync()
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            sync()
            walls[name].append(time.perf_counter() - started)
    return {name: statistics.median(times) for name, times in walls.items()}


def outside_maths(
    loaded: LoadedModel, prompt: str, repeats: int, sync: Callable[[], None] = lambda: None
) -> tuple[dict[str, float], Recorded]:
    """Median seconds of the full analysis and of the replay of its maths, interleaved, after
    two warm-up analyses; and what was replayed."""
    for _ in range(2):
        analyze(loaded, prompt, top_k_heads=20)
    recorded = recorded_analysis(loaded, prompt, top_k_heads=20)
    again = recorded_analysis(loaded, prompt, top_k_heads=20)
    if len(again.products) != len(recorded.products):
        print(
            f"note: the analysis made {len(recorded.products)} then {len(again.products)} "
            "products (U_h kept between them changed): the replay is of the first"
        )
    times = interleaved(
        {
            "analysis": lambda: analyze(loaded, prompt, top_k_heads=20),
            "replay": lambda: replay(recorded),
            "products": lambda: replay(recorded, grams=False),
        },
        repeats,
        sync,
    )
    return times, recorded


def details_stage(loaded: LoadedModel, prompt: str, repeats: int) -> None:
    """The details stage with the label keys on demand vs all computed: the products each
    analysis makes (counted, so load does not blur them), then their times, interleaved."""
    from bench_analysis import heads_stage

    def whole() -> None:
        analyze(loaded, prompt, top_k_heads=20, label_keys="all")

    def lazy() -> None:
        analyze(loaded, prompt, top_k_heads=20)

    for _ in range(2):  # U_h of the recurring heads built (at their second sighting) and kept
        whole()
    products = {
        "all": recorded_analysis(loaded, prompt, top_k_heads=20, label_keys="all"),
        "none": recorded_analysis(loaded, prompt, top_k_heads=20),
    }
    for name, label in (("all", "label keys all computed"), ("none", "label keys on demand")):
        found = products[name]
        print(f"      {label:<24} products {found.rows():,} rows, {found.gflop():.1f} GFLOP")
    fewer = 1 - products["none"].gflop() / products["all"].gflop()
    print(f"      on demand: {fewer * 100:.0f}% fewer product FLOPs in the analysis", flush=True)
    times = interleaved(
        {"heads": lambda: heads_stage(loaded, prompt), "all": whole, "none": lazy},
        repeats,
        lambda: None,
    )
    heads = times["heads"]
    for name, label in (("all", "label keys all computed"), ("none", "label keys on demand")):
        print(
            f"      {label:<24} analysis {times[name] * 1000:8.1f} ms, details stage "
            f"{(times[name] - heads) * 1000:8.1f} ms (per-head stage {heads * 1000:.1f} ms)"
        )
    saved = 1 - (times["none"] - heads) / (times["all"] - heads)
    print(f"      on demand: details stage {saved * 100:.0f}% shorter")


def report(tokens: int, times: dict[str, float], recorded: Recorded, target: float) -> float:
    """Print one length's figures; returns the share of the analysis outside its maths."""
    analysis, maths, products = times["analysis"], times["replay"], times["products"]
    share = (analysis - maths) / analysis
    print(
        f"{tokens:>5} tokens  analysis {analysis * 1000:8.1f} ms   replay of its maths "
        f"{maths * 1000:8.1f} ms ({len(recorded.products)} products, {recorded.rows():,} rows, "
        f"{recorded.gflop():.0f} GFLOP; {len(recorded.grams)} Gram products, "
        f"{recorded.gram_gflop():.1f} GFLOP)   analysis / maths {analysis / maths:.3f}×   "
        f"outside the maths {share * 100:5.1f}% (target ≤ {target * 100:.0f}%)"
    )
    print(
        f"      without the Gram products in the replay: maths {products * 1000:8.1f} ms, "
        f"outside {(analysis - products) / analysis * 100:5.1f}%"
    )
    settled, writes = (
        (sum(pair) for pair in zip(*recorded.settled, strict=True)) if recorded.settled else (0, 0)
    )
    print(
        f"      writes settled by the Taylor expansion (not projected): {settled:,} of {writes:,}"
    )
    return share


def main() -> int:
    from bench_analysis import prompt_of

    from model_worker.model.loading import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[62, 512])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--details", action="store_true", help="the details stage: label keys on demand vs all"
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch threads (default torch's: the cores; 1 on a machine "
        "so shared that two-thread regions spend their time waiting for each other)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(device="cpu", dtype="float32")
    print(
        f"model {loaded.name} (CPU, fp32), torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}"
    )
    print(f"CPU {cpu_model()}; load average {os.getloadavg()[0]:.2f}")
    for tokens in args.tokens:
        prompt = prompt_of(loaded, tokens)
        n = len(loaded.tokenizer(prompt).input_ids)
        if args.details:
            print(f"{n:>5} tokens")
            details_stage(loaded, prompt, args.repeats)
        else:
            times, recorded = outside_maths(loaded, prompt, args.repeats)
            report(n, times, recorded, 0.10)
        print(f"      load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
