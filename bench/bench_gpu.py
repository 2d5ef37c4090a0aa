"""GPU benchmark: a forward pass vs a full analysis, its host and device time, peak GPU memory.

Loads the model given on the command line on CUDA (bf16 weights by default, fp32 analysis maths)
and prints the figures measured in this one run, at 64 and 512 tokens by default. Without CUDA
it says so and exits 0.

Host against device (issue 29's target: host ≤ 2× the GPU maths): the analysis is timed whole
(synchronised), its maths are replayed alone (bench_replay.py: the capturing forward pass and
every vocabulary product again, on the same inputs, synchronised), and one analysis runs under
torch's profiler, whose CUDA kernel and copy times sum to the device's busy time. The host's
time is the analysis's wall time minus the device's busy time (the GPU idles while the host
works: one stream).

    .venv/bin/python bench/bench_gpu.py [MODEL] [--dtype bfloat16] [--repeats 5]
    .venv/bin/python bench/bench_gpu.py --random-like llama-8b --tokenizer bench/tokenizer
    bash bench/gpu_check.sh     # the whole GPU check: versions, 1B and 8B shapes, device tests

MODEL is a Hugging Face id, a local folder or a .gguf (default: SmolLM2-135M-Instruct).
`--random-like SHAPE` builds a Llama of a known shape (SHAPES: SmolLM2-135M's, Llama-3.2-1B's or
Llama-3.1-8B's config) with RANDOM weights directly on the GPU (no CPU copy: 16 GB for 8B), for
machines the real weights cannot reach: timings depend on the shapes, not on the weights. Its
tokenizer comes from `--tokenizer` (a folder, e.g.
SmolLM2's saved with `load_model().tokenizer.save_pretrained(FOLDER)`: bench/tokenizer/ is one),
default the default model's. The random shapes keep their real vocabulary size; the tokenizer's
ids are a subset of it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_analysis import prompt_of
from bench_replay import outside_maths
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from model_worker.model.loading import LoadedModel, freeze_loaded_objects, load_model, wrap_model
from model_worker.run.analyze import analyze

LENGTHS = (64, 512)

#: LlamaConfig fields of real checkpoints' shapes (`--random-like`).
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2": {  # HuggingFaceTB/SmolLM2-135M(-Instruct)
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
    "llama-1b": {  # meta-llama/Llama-3.2-1B
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
    "tiny": {  # for checking this script on a CPU (`--device cpu`): SmolLM2's vocabulary
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 49152,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
    "llama-8b": {  # meta-llama/Llama-3.1-8B
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    },
}


def tokenizer_from(folder: str) -> PreTrainedTokenizerBase:
    """The tokenizer saved in `folder`; its tokenizer.json read directly where this transformers
    does not know the saved tokenizer class (the folder may come from a newer version)."""
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (ValueError, OSError, KeyError, AttributeError) as exc:
        print(f"AutoTokenizer could not read {folder} ({exc}); reading its tokenizer.json")
        config = json.loads((Path(folder) / "tokenizer_config.json").read_text())
        special = {
            k: config[k]
            for k in ("bos_token", "eos_token", "unk_token", "pad_token")
            if k in config
        }
        return PreTrainedTokenizerFast(
            tokenizer_file=str(Path(folder) / "tokenizer.json"), **special
        )


def random_like(shape: str, tokenizer: str | None, dtype: str, device: str) -> LoadedModel:
    """A Llama of SHAPES[shape] with random (seeded) weights, built on `device` in `dtype`
    (directly there: no copy on the CPU)."""
    config = LlamaConfig(**SHAPES[shape], bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=getattr(torch, dtype), attn_implementation="eager"
        )
    words = tokenizer_from(tokenizer) if tokenizer else load_model().tokenizer
    loaded = wrap_model(model.eval(), words, name=f"random-like-{shape}")
    freeze_loaded_objects()  # as load_model does: the GC's scans skip the model's objects
    return loaded


def synchronize(device: torch.device) -> None:
    """Wait for `device`'s queued work (CUDA); nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_seconds(run: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median wall seconds of `run` (synchronised, after one warm-up call)."""
    run()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peak_gib(run: Callable[[], object], device: torch.device) -> float | None:
    """Peak GPU memory (GiB) allocated while `run` runs once (None off CUDA)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    run()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**30


def gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} GiB"


def device_busy_seconds(run: Callable[[], object], device: torch.device) -> float | None:
    """Seconds the GPU spent in kernels and copies while `run` ran once (torch's profiler:
    the sum of the CUDA activities' own times); None where the profiler saw no CUDA activity
    (no CUPTI), or off CUDA."""
    from torch.profiler import ProfilerActivity, profile

    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize(device)
    # as torch's own table sums "Self CUDA time total": the device-side events (kernels, copies)
    from torch.autograd import DeviceType

    total_us = sum(
        e.self_device_time_total
        for e in prof.key_averages()
        if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    )
    return total_us / 1e6 if total_us > 0 else None


def host_profile(run: Callable[[], object], device: torch.device, top: int = 22) -> None:
    """Where the host's time goes in one run of `run`: cProfile's functions by own time (torch
    calls count there as the host's time to launch them; synchronised copies as waits)."""
    import cProfile
    import gc
    import io
    import pstats

    gc.collect()  # the torch profiler's events, freed: no collection scanning them in the run
    synchronize(device)
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    synchronize(device)
    profiler.disable()
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(top)
        lines = [line for line in text.getvalue().splitlines() if line.strip()]
        print(f"      host profile of one analysis (cProfile, by {order}):")
        for line in lines[2:]:
            print(f"        {line.replace('/work/main/', '')[:150]}")


def bench_length(loaded: LoadedModel, tokens: int, repeats: int, profile: bool = False) -> None:
    prompt = prompt_of(loaded, tokens)
    ids = loaded.tokenizer(prompt, return_tensors="pt").input_ids.to(loaded.device)

    def forward() -> object:
        with torch.inference_mode():
            return loaded.model(ids, use_cache=False)

    def full() -> object:
        return analyze(loaded, prompt, top_k_heads=20)

    device = loaded.device
    t_forward = device_seconds(forward, repeats, device)
    times, recorded = outside_maths(loaded, prompt, repeats, lambda: synchronize(device))
    t_full, t_maths = times["analysis"], times["replay"]
    busy = device_busy_seconds(full, device)
    print(
        f"{ids.shape[1]:>4} tokens  forward {t_forward * 1000:8.1f} ms   analysis "
        f"{t_full * 1000:8.1f} ms   ratio {t_full / t_forward:6.1f}×   peak memory: forward "
        f"{gib(peak_gib(forward, device))}, analysis {gib(peak_gib(full, device))}"
    )
    print(
        f"      maths replayed alone (capture + {len(recorded.products)} products, "
        f"{recorded.gflop():.0f} GFLOP) {t_maths * 1000:8.1f} ms: analysis / maths "
        f"{t_full / t_maths:5.2f}×"
    )
    if busy is None:
        print("      device busy time: no CUDA activity profiled; the replay's time stands for it")
        host, device = t_full - t_maths, t_maths
        source = "the replay"
    else:
        host, device = t_full - busy, busy
        source = "the profiler"
    print(
        f"      device busy {device * 1000:8.1f} ms (from {source}), host {host * 1000:8.1f} ms: "
        f"host / device {host / device:5.2f}× (target ≤ 2×)"
    )
    if profile:
        host_profile(full, loaded.device)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16, float16 or float32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--random-like", choices=sorted(SHAPES), help="random weights, real shape")
    parser.add_argument("--tokenizer", help="tokenizer folder for --random-like")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument(
        "--device", default="cuda", help="cuda (default), or cpu to check this script without one"
    )
    parser.add_argument(
        "--profile", action="store_true", help="also where the host's time goes (cProfile)"
    )
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here: bench_gpu.py measures GPU runs only (nothing measured)")
        return 0
    started = time.perf_counter()
    if args.random_like:
        loaded = random_like(args.random_like, args.tokenizer, args.dtype, args.device)
    else:
        loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    on_cuda = loaded.device.type == "cuda"
    weights = torch.cuda.memory_allocated() / 2**30 if on_cuda else None
    where = torch.cuda.get_device_name(loaded.device) if on_cuda else "the CPU"
    print(
        f"{loaded.name} ({loaded.adapter.family}, {args.dtype} weights, {gib(weights)}) on "
        f"{where}, torch {torch.__version__}, fp32 matmul precision "
        f"{torch.get_float32_matmul_precision()!r}; built in {time.perf_counter() - started:.1f} s"
    )
    if args.random_like:
        print("RANDOM weights of the real shape: the timings hold for the shape, not the values")
    for tokens in args.tokens:
        if loaded.max_positions is not None and tokens > loaded.max_positions:
            print(f"{tokens} tokens: longer than the model's context ({loaded.max_positions})")
            continue
        bench_length(loaded, tokens, args.repeats, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
