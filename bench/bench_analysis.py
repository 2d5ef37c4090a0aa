"""Benchmark of one full analysis against one forward pass and the head-zeroing baseline.

SmolLM2-135M on CPU, a 64-token word-classification prompt. Prints ratios measured in this one
run (the machine is shared and noisy): targets are analysis ≤ 8× a forward pass, ≥ 30× faster
than zeroing each head in turn (L·H forward passes), and peak memory ≤ 2 GB.

    .venv/bin/python bench/bench_analysis.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable

import torch

from model_worker.analyze import analyze
from model_worker.loading import LoadedModel, load_model


def prompt_of(loaded: LoadedModel, tokens: int) -> str:
    """A word-classification prompt of exactly `tokens` tokens (demonstrations repeated)."""
    demos = ["love : bar", "eight : foo", "hate : bar", "two : foo", "happy : bar", "six : foo"]
    words: list[str] = []
    while True:
        candidate = " ".join([*words, demos[len(words) % len(demos)], "one :"])
        if len(loaded.tokenizer(candidate).input_ids) > tokens:
            break
        words.append(demos[len(words) % len(demos)])
    prompt = " ".join([*words, "one :"])
    return prompt


def median_time(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of `run` (after one warm-up call)."""
    run()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def line(name: str, seconds: tuple[float, float], note: str = "") -> None:
    wall, cpu = seconds
    print(f"{name:<28} wall {wall * 1000:9.1f} ms   cpu {cpu * 1000:9.1f} ms   {note}")


def zero_each_head(loaded: LoadedModel, ids: torch.Tensor, target: int) -> list[float]:
    """The dynamic baseline: the target's log-prob drop when each head's z is zeroed."""
    g, adapter, model = loaded.geometry, loaded.adapter, loaded.model
    drops = []
    with torch.inference_mode():
        base = torch.log_softmax(model(ids).logits[0, -1], -1)[target]
        for layer in range(g.n_layers):
            out_proj = adapter.sub(model, layer, adapter.spec.out_proj)
            for head in range(g.n_heads):

                def zero(
                    _m: torch.nn.Module, args: tuple[torch.Tensor, ...], h: int = head
                ) -> tuple:
                    z = args[0].clone()
                    z[..., h * g.d_head : (h + 1) * g.d_head] = 0
                    return (z,)

                handle = out_proj.register_forward_pre_hook(zero)
                try:
                    logprob = torch.log_softmax(model(ids).logits[0, -1], -1)[target]
                finally:
                    handle.remove()
                drops.append(float(base - logprob))
    return drops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--skip-baseline", action="store_true", help="skip zeroing each head (270 passes)"
    )
    args = parser.parse_args()
    loaded = load_model(device="cpu", dtype="float32")
    prompt = prompt_of(loaded, args.tokens)
    ids = loaded.tokenizer(prompt, return_tensors="pt").input_ids
    threads = torch.get_num_threads()
    print(f"model {loaded.name}, prompt {ids.shape[1]} tokens, torch threads {threads}")

    def forward() -> None:
        with torch.inference_mode():
            loaded.model(ids)

    forward_s = median_time(forward, args.repeats)
    analysis_s = median_time(lambda: analyze(loaded, prompt, top_k_heads=20), args.repeats)
    line("forward pass", forward_s)
    line("full analysis (K=20)", analysis_s)
    for label, index in (("wall", 0), ("cpu", 1)):
        print(
            f"{label}: analysis = {analysis_s[index] / forward_s[index]:.2f}× a forward pass "
            "(target ≤ 8×)"
        )
    if not args.skip_baseline:
        target = analyze(loaded, prompt, top_k_heads=20).target.id
        baseline_s = median_time(lambda: zero_each_head(loaded, ids, target), 1)
        n_heads = loaded.geometry.n_layers * loaded.geometry.n_heads
        line(f"zero each head ({n_heads} passes)", baseline_s)
        for label, index in (("wall", 0), ("cpu", 1)):
            ratio = baseline_s[index] / analysis_s[index]
            print(f"{label}: baseline = {ratio:.1f}× the analysis (target ≥ 30×)")
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(f"peak RSS of this process {peak_gb:.2f} GB (target ≤ 2 GB)")


if __name__ == "__main__":
    main()
