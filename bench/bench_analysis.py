"""Benchmark of one full analysis against one forward pass and the head-zeroing baseline.

SmolLM2-135M on CPU, a 64-token word-classification prompt. Prints ratios measured in this one
run, interleaved (the machine may be shared and noisy): targets are analysis ≤ 5× a forward
pass (the model's linear layers on their calibrated kernel, as the explorer runs them; also
printed against torch's own kernels), its per-head stage (what the heatmap needs) ≤ 2×, ≥ 30×
faster than zeroing each head in turn (L·H forward passes), and peak memory ≤ 2 GB. Also the
GFLOP/s of each candidate unembedding kernel on one real block, and the one the calibration
chose, and the pages a full analysis faults in (`GLIBC_TUNABLES= …` in front: glibc's default
allocator, for comparison). `--isa avx2` reruns it with every kernel capped at AVX2 (the path
an older CPU takes; bench/machine.py).

    .venv/bin/python bench/bench_analysis.py [--repeats 5] [--isa avx2]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable

import torch
from machine import ISA_ENV, apply_isa, cpu_model

from model_worker.analysis.kernels import kernel_for, kernels
from model_worker.model.linear_routing import default_linear_layers
from model_worker.model.loading import LoadedModel, load_model
from model_worker.resources.allocator import keep_freed_memory
from model_worker.resources.unembedding_cache import HeadUnembeddings
from model_worker.run.analyze import analyze


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


class _HeadsDone(Exception):
    """Stops an analysis once its per-head stage is done (to time that stage)."""


def heads_stage(loaded: LoadedModel, prompt: str) -> None:
    """An analysis up to its per-head stage (what the heatmap needs), then stopped."""

    def stop(_partial: object) -> None:
        raise _HeadsDone

    try:
        analyze(loaded, prompt, top_k_heads=20, on_heads=stop)
    except _HeadsDone:
        return
    raise RuntimeError("the per-head stage was never reached")


def interleaved(
    runs: dict[str, Callable[[], object]], repeats: int
) -> dict[str, tuple[float, float]]:
    """Median wall and CPU seconds of each run, alternating them (after one warm-up each), so
    that the machine's load weighs on all alike."""
    walls: dict[str, list[float]] = {name: [] for name in runs}
    cpus: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()
    for _ in range(repeats):
        for name, run in runs.items():
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            walls[name].append(time.perf_counter() - wall)
            cpus[name].append(time.process_time() - cpu)
    return {name: (statistics.median(walls[name]), statistics.median(cpus[name])) for name in runs}


def page_faults(run: Callable[[], object], repeats: int = 5) -> tuple[int, float]:
    """Median minor page faults and mean system milliseconds of `run` (memory freed by one
    call and faulted in again by the next shows here; model_worker/resources/allocator.py)."""
    faults, system = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_SELF)
        run()
        after = resource.getrusage(resource.RUSAGE_SELF)
        faults.append(after.ru_minflt - before.ru_minflt)
        system.append(after.ru_stime - before.ru_stime)
    return int(statistics.median(faults)), 1000 * statistics.mean(system)


def kernel_rates(loaded: LoadedModel, repeats: int) -> str:
    """GFLOP/s of every candidate unembedding kernel on one real block (160 × D · W_Uᵀ),
    and the one the calibration chose."""
    w_u = loaded.unembedding()[0]
    x = torch.randn(160, w_u.shape[1])
    flops = 2 * x.shape[0] * w_u.shape[0] * w_u.shape[1]
    candidates = kernels(x, w_u, kept=True)
    times = interleaved({name: (lambda k=k: k(x, w_u)) for name, k in candidates.items()}, repeats)
    rates = ", ".join(f"{name} {flops / t[0] / 1e9:.0f}" for name, t in times.items())
    return f"{rates} GFLOP/s; chosen: {kernel_for(x, w_u, kept=True).name}"


def setup(
    description: str, repeats: int, baseline: bool = False
) -> tuple[argparse.Namespace, LoadedModel, str, torch.Tensor]:
    """Arguments (--repeats, --tokens, --isa, and --no-baseline if `baseline`), SmolLM2 on the CPU,
    the prompt and its ids; prints the model, prompt length, threads, CPU model and load."""
    apply_isa(sys.argv)
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument(
        "--isa", choices=ISA_ENV, help="cap torch's, oneDNN's and MKL's kernels at this ISA"
    )
    parser.add_argument("--tokens", type=int, default=64)
    if baseline:
        parser.add_argument(
            "--no-baseline", action="store_true", help="skip zeroing each head (L·H passes)"
        )
    args = parser.parse_args()
    loaded = load_model(device="cpu", dtype="float32")
    prompt = prompt_of(loaded, args.tokens)
    ids = loaded.tokenizer(prompt, return_tensors="pt").input_ids
    threads = torch.get_num_threads()
    print(f"model {loaded.name}, prompt {ids.shape[1]} tokens, torch threads {threads}")
    print(f"CPU {cpu_model()}; load average {os.getloadavg()[0]:.2f}")
    return args, loaded, prompt, ids


def main() -> None:
    args, loaded, prompt, ids = setup(__doc__.splitlines()[0], 5, baseline=True)
    kept_freed = keep_freed_memory()  # as load_model set it (GLIBC_TUNABLES= in the env: not)

    def forward() -> None:
        with torch.inference_mode():
            loaded.model(ids)

    def default_forward() -> None:
        """The forward pass with torch's own linear kernels (as transformers runs the model)."""
        with default_linear_layers(loaded.model):
            forward()

    def cold_analysis() -> None:
        """An analysis whose heads are detailed for the first time (no U_h kept or noted);
        the other runs keep theirs."""
        kept, loaded.head_unembeddings = loaded.head_unembeddings, HeadUnembeddings()
        try:
            analyze(loaded, prompt, top_k_heads=20)
        finally:
            loaded.head_unembeddings = kept

    times = interleaved(
        {
            "forward pass": forward,
            "forward, torch's kernels": default_forward,
            "per-head stage": lambda: heads_stage(loaded, prompt),
            "full analysis (K=20)": lambda: analyze(loaded, prompt, top_k_heads=20),
            "full, heads seen first": cold_analysis,
        },
        args.repeats,
    )
    forward_s, default_s, heads_s, analysis_s, cold_s = times.values()
    for name, seconds in times.items():
        line(name, seconds)
    print(
        f"the model's linear layers on the calibrated kernel (linear_routing): forward pass "
        f"{default_s[0] / forward_s[0]:.2f}× faster than on torch's own; the ratios below are "
        f"against the faster one (the forward pass as the explorer runs it); against torch's "
        f"own: analysis {analysis_s[0] / default_s[0]:.1f}×, per-head stage "
        f"{heads_s[0] / default_s[0]:.1f}× (wall)"
    )
    for label, index in (("wall", 0), ("cpu", 1)):
        print(
            f"{label}: analysis = {analysis_s[index] / forward_s[index]:.1f}× a forward pass "
            f"(target ≤ 5×; {cold_s[index] / forward_s[index]:.1f}× where its heads are "
            f"detailed for the first time), per-head stage = "
            f"{heads_s[index] / forward_s[index]:.1f}× (target ≤ 2×)"
        )
    if not args.no_baseline:
        target = analyze(loaded, prompt, top_k_heads=20).target.id
        baseline_s = median_time(lambda: zero_each_head(loaded, ids, target), 1)
        n_heads = loaded.geometry.n_layers * loaded.geometry.n_heads
        line(f"zero each head ({n_heads} passes)", baseline_s)
        for label, index in (("wall", 0), ("cpu", 1)):
            ratio = baseline_s[index] / analysis_s[index]
            print(f"{label}: baseline = {ratio:.1f}× the analysis (target ≥ 30×)")
    print(f"unembedding kernels: {kernel_rates(loaded, args.repeats)}")
    faults, system_ms = page_faults(lambda: analyze(loaded, prompt, top_k_heads=20))
    print(
        f"a full analysis page-faults {faults} pages in ({system_ms:.0f} ms of system time; "
        f"freed memory kept: {kept_freed})"
    )
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(f"peak RSS of this process {peak_gb:.2f} GB (target ≤ 2 GB)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
