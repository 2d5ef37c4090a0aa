"""GPU benchmark: one forward pass vs one full analysis, and peak GPU memory, at 64 and 512 tokens.

Loads the model given on the command line on CUDA (bf16 weights by default, fp32 analysis maths)
and prints the figures measured in this one run. Without CUDA it says so and exits 0.

    .venv/bin/python bench/bench_gpu.py [MODEL] [--dtype bfloat16] [--repeats 5]
    .venv/bin/python bench/bench_gpu.py --random-like smollm2 --tokenizer FOLDER [--dtype ...]

MODEL is a Hugging Face id, a local folder or a .gguf (default: SmolLM2-135M-Instruct).
`--random-like SHAPE` builds a Llama of a known shape (SHAPES: SmolLM2-135M's or Llama-3.2-1B's
config) with RANDOM weights on the GPU, for machines the real weights cannot reach: timings
depend on the shapes, not on the weights. Its tokenizer comes from `--tokenizer` (a folder, e.g.
SmolLM2's saved with `load_model().tokenizer.save_pretrained(FOLDER)`), default the default
model's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from bench_analysis import prompt_of
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from model_worker.loading import LoadedModel, freeze_loaded_objects, load_model, wrap_model
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
}


def random_like(shape: str, tokenizer: str | None, dtype: str, device: str) -> LoadedModel:
    """A Llama of SHAPES[shape] with random (seeded) weights, built on `device` in `dtype`."""
    config = LlamaConfig(**SHAPES[shape], bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=getattr(torch, dtype), attn_implementation="eager"
        )
    words = AutoTokenizer.from_pretrained(tokenizer) if tokenizer else load_model().tokenizer
    loaded = wrap_model(model.eval(), words, name=f"random-like-{shape}")
    freeze_loaded_objects()  # as load_model does: the GC's scans skip the model's objects
    return loaded


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
    parser.add_argument("--random-like", choices=sorted(SHAPES), help="random weights, real shape")
    parser.add_argument("--tokenizer", help="tokenizer folder for --random-like")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(LENGTHS))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device here: bench_gpu.py measures GPU runs only (nothing measured)")
        return 0
    if args.random_like:
        loaded = random_like(args.random_like, args.tokenizer, args.dtype, "cuda")
    else:
        loaded = load_model(args.model, device="cuda", dtype=args.dtype)
    weights = torch.cuda.memory_allocated() / 2**30
    print(
        f"{loaded.name} ({loaded.adapter.family}, {args.dtype} weights, {weights:.2f} GiB) on "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, fp32 matmul precision "
        f"{torch.get_float32_matmul_precision()!r}"
    )
    if args.random_like:
        print("RANDOM weights of the real shape: the timings hold for the shape, not the values")
    for tokens in args.tokens:
        if loaded.max_positions is not None and tokens > loaded.max_positions:
            print(f"{tokens} tokens: longer than the model's context ({loaded.max_positions})")
            continue
        bench_length(loaded, tokens, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
