"""Peak memory of one analysis against the prompt's length: SmolLM2-135M on the CPU, each case in
a fresh process (peak RSS is per process), the capture narrowed to what the analysis reads (the
default) and, for comparison, the whole capture (every position, the full [L, H, S, S] pattern).
Then the bytes an analysis keeps for a model shape, from the capture's own rules, for an 8B
(Llama-3.1-8B-shaped) model in bf16 at 4,096 tokens.

Target (issue 29): SmolLM2 at 1,024 tokens ≤ 2 GB peak RSS; an 8B at 4,096 tokens fits one
80 GB GPU in bf16.

    nice -n 10 .venv/bin/python bench/bench_memory.py [--tokens 1024 4096] [--full 1024]
        [--top-k-heads 20]

Each case prints the load average (1 min) before and after it: peak RSS does not depend on the
load, the seconds do.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

from machine import cpu_model


def one_case(tokens: int, full: bool, top_k_heads: int) -> dict[str, float]:
    """Run in a child: load SmolLM2, analyse a prompt of `tokens` tokens, report peak RSS."""
    import torch
    from bench_analysis import prompt_of

    import model_worker.run.analyze as analyze_module
    from model_worker.model.capture import KEEP_ALL
    from model_worker.model.loading import load_model

    loaded = load_model(device="cpu", dtype="float32")
    after_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    prompt = prompt_of(loaded, tokens)
    if full:
        analyze_module.Keep = lambda **_: KEEP_ALL  # type: ignore[assignment,misc]
    heads_stage: dict[str, float] = {}

    def peak_so_far(_partial: object) -> None:
        heads_stage["peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    start = time.perf_counter()
    with torch.inference_mode():
        result = analyze_module.analyze(
            loaded, prompt, max_tokens=tokens + 8, top_k_heads=top_k_heads, on_heads=peak_so_far
        )
    return {
        "tokens": len(result.tokens),
        "labels": len(result.labels),
        "load_peak_gib": after_load,
        "heads_stage_peak_gib": heads_stage["peak"],
        "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "seconds": time.perf_counter() - start,
        "unembeddings_gib": loaded.head_unembeddings.nbytes / 2**30,
        "json_mib": len(result.model_dump_json()) / 2**20,
    }


def kept_bytes(
    *,
    layers: int,
    heads: int,
    kv_heads: int,
    d_model: int,
    d_head: int,
    vocab: int,
    params: float,
    tokens: int,
    labels: int,
    detailed_layers: int = 20,
) -> dict[str, float]:
    """GiB an analysis needs beyond the model's own weights (`params` in bf16): its fp32 capture,
    narrowed (the residual stream at the last position; at the labels too when label-key
    tables are asked for, `labels` > 0) and whole, eager attention's transient [H, S, S] scores
    of one layer (bf16 and their fp32 softmax), and the fp32 copies it reads (W_U; W_O and W_K
    of the detailed heads' layers, at most K of them; the per-head stage's W_O one layer at a
    time)."""
    positions = labels + 1
    values_keys = 2 * layers * tokens * kv_heads * d_head * 4  # v and the recorded keys
    residual = 4 * layers * d_model * 4 + layers * heads * d_head * 4  # 4 streams + z, a position
    narrowed = residual * positions + values_keys + layers * heads * (tokens + d_head) * 4
    queries = layers * heads * tokens * d_head * 4
    whole = residual * tokens + values_keys + queries + layers * heads * tokens * tokens * 4
    transient = heads * tokens * tokens * (2 + 4)
    per_layer = (heads + kv_heads) * d_head * d_model
    copies = (vocab * d_model + min(layers, detailed_layers) * per_layer) * 4
    gib = 2**30
    return {
        "narrowed": narrowed / gib,
        "whole": whole / gib,
        "transient": transient / gib,
        "copies": copies / gib,
        "weights": params * 2 / gib,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="*", default=[1024, 4096])
    parser.add_argument("--full", type=int, nargs="*", default=[1024])
    parser.add_argument("--top-k-heads", type=int, default=20)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        tokens, full = args.child.split(":")
        print(json.dumps(one_case(int(tokens), full == "full", args.top_k_heads)))
        return
    print(f"CPU: {cpu_model()}")
    cases = [(n, False) for n in args.tokens] + [(n, True) for n in args.full]
    for tokens, full in cases:
        before = os.getloadavg()[0]
        child = [sys.executable, __file__, "--child", f"{tokens}:{'full' if full else 'kept'}"]
        done = subprocess.run(
            [*child, "--top-k-heads", str(args.top_k_heads)], capture_output=True, text=True
        )
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{tokens:>6} tokens  {'whole' if full else 'narrowed'} capture: failed ({tail})")
            continue
        case = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"{case['tokens']:>6} tokens ({case['labels']} labels)  "
            f"{'whole' if full else 'narrowed'} capture: peak RSS {case['peak_gib']:.2f} GiB "
            f"(after loading {case['load_peak_gib']:.2f}, after the capture and per-head stage "
            f"{case['heads_stage_peak_gib']:.2f}; U_h kept {case['unembeddings_gib']:.2f}), "
            f"analysis {case['seconds']:.1f} s, result JSON {case['json_mib']:.1f} MiB; "
            f"load {before:.1f} → {os.getloadavg()[0]:.1f}"
        )
    shapes: dict[str, dict[str, Any]] = {
        "SmolLM2-135M": dict(
            layers=30, heads=9, kv_heads=3, d_model=576, d_head=64, vocab=49152, params=135e6
        ),
        "Llama-3.1-8B": dict(
            layers=32, heads=32, kv_heads=8, d_model=4096, d_head=128, vocab=128256, params=8.0e9
        ),
    }
    for name, shape in shapes.items():
        for tokens in (1024, 4096):
            est = kept_bytes(**shape, tokens=tokens, labels=0)
            keyed = kept_bytes(**shape, tokens=tokens, labels=tokens // 8)["narrowed"]
            total = est["weights"] + est["narrowed"] + est["transient"] + est["copies"]
            print(
                f"{name} at {tokens} tokens: capture {est['narrowed']:.2f} GiB narrowed "
                f"({keyed:.2f} with label keys at a label every 8 tokens) vs "
                f"{est['whole']:.1f} GiB whole; attention "
                f"scores {est['transient']:.2f} GiB a layer; fp32 W_U + detailed layers' W_O, W_K "
                f"{est['copies']:.1f} GiB; bf16 weights {est['weights']:.1f} GiB; "
                f"total ≈ {total:.1f} GiB (+ the U_h budget and one 512 MiB projection block)"
            )


if __name__ == "__main__":
    main()
