"""GPU benchmark: one forward pass vs one full analysis, and peak GPU memory, at 64 and 512 tokens.

Loads the model given on the command line on CUDA (bf16 weights by default, fp32 analysis maths)
and prints the figures measured in this one run. Without CUDA it says so and exits 0.

    .venv/bin/python bench/bench_gpu.py [MODEL] [--dtype bfloat16] [--repeats 5]

MODEL is a Hugging Face id, a local folder or a .gguf (default: SmolLM2-135M-Instruct).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
from bench_analysis import prompt_of

from model_worker.analyze import analyze
from model_worker.loading import LoadedModel, load_model

LENGTHS = (64, 512)


def cuda_seconds(run: Callable[[], object], repeats: int) -> float:
    """Median wall seconds of `run` on CUDA (synchronised, after one warm-up call)."""
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peak_gib(run: Callable[[], object]) -> float:
    """Peak GPU memory (GiB) allocated while `run` runs once."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def bench_length(loaded: LoadedModel, tokens: int, repeats: int) -> None:
    prompt = prompt_of(loaded, tokens)
    ids = loaded.tokenizer(prompt, return_tensors="pt").input_ids.to(loaded.device)

    def forward() -> object:
        with torch.inference_mode():
            return loaded.model(ids, use_cache=False)

    def full() -> object:
        return analyze(loaded, prompt, top_k_heads=20)

    t_forward, t_full = cuda_seconds(forward, repeats), cuda_seconds(full, repeats)
    print(
        f"{ids.shape[1]:>4} tokens  forward {t_forward * 1000:8.1f} ms   analysis "
        f"{t_full * 1000:8.1f} ms   ratio {t_full / t_forward:6.1f}×   peak memory: forward "
        f"{peak_gib(forward):.2f} GiB, analysis {peak_gib(full):.2f} GiB"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16, float16 or float32")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device here: bench_gpu.py measures GPU runs only (nothing measured)")
        return 0
    loaded = load_model(args.model, device="cuda", dtype=args.dtype)
    name = torch.cuda.get_device_name()
    print(f"{loaded.name} ({loaded.adapter.family}, {args.dtype}) on {name}")
    for tokens in LENGTHS:
        if loaded.max_positions is not None and tokens > loaded.max_positions:
            print(f"{tokens} tokens: longer than the model's context ({loaded.max_positions})")
            continue
        bench_length(loaded, tokens, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
