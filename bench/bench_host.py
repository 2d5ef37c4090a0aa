"""The host's share of an analysis, measured on the CPU: a Llama of Llama-3.2-1B's structure
(16 layers, 32 query and 8 KV heads, its rotary settings; bench_gpu.SHAPES["llama-1b"]) with
tiny widths (head_dim 8, d_model 32, MLP 32) and a vocabulary of 1,024 tokens, so that
the maths is negligible and an analysis's wall time is almost all per-call overhead: the
thousands of small torch calls and the Python around them that, on a GPU, the host spends
while the device waits (issue 29: host ≤ 2× the GPU's maths). The vocabulary is bench/tokenizer's
(SmolLM2's) first VOCAB tokens, the prompt's words among them: a word-level tokenizer over the
same byte-level pieces (each of the prompt's words is one SmolLM2 token), so that the
vocabulary products and per-logit passes stay small too.

Prints, per prompt length (bench_analysis.prompt_of: 62 and 512 tokens by default), after two
warm-up analyses: the median wall time of `analyze()` (K = 20), the number of torch operator
calls one analysis makes (counted by a TorchDispatchMode: every aten operator that reaches
the dispatcher below autograd, i.e. one kernel launch each on a GPU, views included), and where
they come from, grouped by the nearest frame of our own code (`model_worker/…`; "(model)" marks
calls made inside the model's forward, under that frame).

    PYTHONPATH=.:bench .venv/bin/python bench/bench_host.py [--tokens 62 512] [--repeats 7]

As on a GPU's host, torch computes on one thread (`--threads`): the tiny operators gain nothing
from more, and idle threads' hand-offs only add noise on a shared machine. As on a GPU, the
products run on torch's public kernels only: the CPU's oneDNN candidates
(`analysis.kernels`, `linear_routing`) are left out, so that neither the counts nor the times
depend on a calibration; and the analysis takes a GPU's branches where the CPU has its own
(`model_worker.resources.device_branches`: no Taylor expansion of small writes, ranks in one
comparison,
several factored heads a block). `--profile` also prints cProfile's functions of one analysis
by own time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from bench_analysis import prompt_of
from bench_gpu import SHAPES, tokenizer_from
from machine import cpu_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

from model_worker.analysis import kernels
from model_worker.model.linear_routing import default_linear_layers
from model_worker.model.loading import LoadedModel, freeze_loaded_objects, wrap_model
from model_worker.resources.device_branches import gpu_branches
from model_worker.run.analyze import analyze

TOKENIZER = str(Path(__file__).parent / "tokenizer")
#: Llama-3.2-1B's structure, its widths shrunk (head_dim 8: 32 heads → d_model 256 would be the
#: real ratio; 32 keeps every product tiny)
TINY = {"hidden_size": 32, "intermediate_size": 32, "head_dim": 8}
VOCAB = 1024
OWN = os.sep + "model_worker" + os.sep


def tiny_llama_1b(tokens: list[int]) -> LoadedModel:
    """Llama-3.2-1B's layers, heads and rotary with TINY widths, random weights (seeded), fp32,
    with `word_level` tokenizer for prompts of up to max(`tokens`) tokens."""
    words = word_level(tokenizer_from(TOKENIZER), max(tokens))
    shape = {**SHAPES["llama-1b"], **TINY, "vocab_size": VOCAB}
    config = LlamaConfig(**shape, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager"
    )
    loaded = wrap_model(model.eval(), words, name="tiny-llama-1b")
    freeze_loaded_objects()
    return loaded


def word_level(smollm2: Any, tokens: int) -> PreTrainedTokenizerFast:
    """A tokenizer of VOCAB ids: SmolLM2's first tokens, then the byte-level pieces of the
    benchmark prompt's words (prompt_of with SmolLM2's tokenizer: one token a word, so the
    prompts have the same lengths), split and decoded as SmolLM2 does (byte-level)."""

    class Words:  # prompt_of reads `.tokenizer` only
        tokenizer = smollm2

    prompt = prompt_of(Words(), tokens)  # type: ignore[arg-type]
    pieces = dict.fromkeys(
        piece for word in sorted(set(prompt.split())) for piece in (word, "Ġ" + word)
    )
    first = [t for t, _ in sorted(smollm2.get_vocab().items(), key=lambda kv: kv[1])]
    kept = [t for t in first if t not in pieces][: VOCAB - len(pieces)]
    vocab = {token: i for i, token in enumerate([*kept, *pieces])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=smollm2.unk_token))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    special = {k: getattr(smollm2, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    return PreTrainedTokenizerFast(tokenizer_object=backend, **special)


class CallCounter(TorchDispatchMode):
    """Counts every aten operator call, keyed by the nearest model_worker frame (file:function)
    and whether the call came from inside the model's forward (a transformers frame nearer)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_source: Counter[str] = Counter()
        self.by_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.by_source[source()] += 1
        self.by_op[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_source.values())


def source() -> str:
    """`module.py:function` of the nearest model_worker frame on the stack, "(model)" added
    where a transformers frame is nearer (the call is the model's own)."""
    frame = sys._getframe(2)
    in_model = False
    while frame is not None:
        name = frame.f_code.co_filename
        if OWN in name:
            where = name.split(OWN, 1)[1].removesuffix(".py")
            key = f"{where}:{frame.f_code.co_name}"
            return f"{key} (model)" if in_model else key
        if f"{os.sep}transformers{os.sep}" in name:
            in_model = True
        frame = frame.f_back  # type: ignore[assignment]
    return "(outside model_worker)"


def median_times(loaded: LoadedModel, prompt: str, repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of one analysis (CPU time: less moved by other processes)."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        analyze(loaded, prompt, top_k_heads=20)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def profile_one(loaded: LoadedModel, prompt: str, top: int) -> None:
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    analyze(loaded, prompt, top_k_heads=20)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    for line in text.getvalue().splitlines()[2:]:
        if line.strip():
            print(f"    {line.replace(os.getcwd() + os.sep, '')[:150]}")


def public_kernels_only() -> None:
    """The unembedding products' calibration offered torch's public kernels only (a GPU's)."""
    every = kernels.kernels

    def public(x: torch.Tensor, w: torch.Tensor, kept: bool = False) -> dict[str, Any]:
        return {k: f for k, f in every(x, w, kept).items() if k in kernels._PUBLIC}

    kernels.kernels = public  # type: ignore[assignment]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[62, 512])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--top", type=int, default=15, help="sources of calls listed")
    parser.add_argument("--profile", action="store_true", help="cProfile of one analysis too")
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    public_kernels_only()
    loaded = tiny_llama_1b(args.tokens)
    with default_linear_layers(loaded.model), gpu_branches():  # the model's layers on F.linear
        return run(loaded, args)


def run(loaded: LoadedModel, args: argparse.Namespace) -> int:
    g = loaded.geometry
    print(
        f"{cpu_model()}; torch {torch.__version__}, {torch.get_num_threads()} threads\n"
        f"Llama-3.2-1B structure ({g.n_layers} layers, {g.n_heads} heads, {g.n_kv_heads} KV "
        f"heads), d_head {g.d_head}, d_model {g.d_model}, vocabulary "
        f"{loaded.model.config.vocab_size}, random fp32 weights; K = 20"
    )
    for tokens in args.tokens:
        prompt = prompt_of(loaded, tokens)
        n = len(loaded.tokenizer(prompt).input_ids)
        for _ in range(2):
            analyze(loaded, prompt, top_k_heads=20)
        wall, cpu = median_times(loaded, prompt, args.repeats)
        counter = CallCounter()
        with counter:
            analyze(loaded, prompt, top_k_heads=20)
        print(
            f"\n{n} tokens: analysis {wall * 1000:.1f} ms wall, {cpu * 1000:.1f} ms CPU (medians "
            f"of {args.repeats}), "
            f"{counter.total} torch operator calls ({wall / counter.total * 1e6:.1f} µs a call)"
        )
        print("  calls by source (nearest model_worker frame):")
        for key, count in counter.by_source.most_common(args.top):
            print(f"    {count:6d}  {key}")
        ops = ", ".join(f"{op} {count}" for op, count in counter.by_op.most_common(10))
        print(f"  commonest operators: {ops}")
        if args.profile:
            print("  cProfile of one analysis, by own time:")
            profile_one(loaded, prompt, 25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
