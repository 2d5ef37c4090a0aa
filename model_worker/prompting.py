"""Prompt handling before a forward pass: tokenizing with limits, targets, head names."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from model_worker.contracts import model_head
from model_worker.defaults import DEFAULT_MAX_PROMPT_TOKENS
from model_worker.errors import LabelError, PromptError
from model_worker.loading import LoadedModel


@dataclass(frozen=True)
class Encoded:
    """A tokenized prompt: ids [S], character offsets, display strings."""

    ids: Tensor
    offsets: list[tuple[int, int]]
    texts: list[str]


def token_limit(loaded: LoadedModel, max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS) -> int:
    """The longest prompt analysed: `max_tokens`, or the model's context if shorter."""
    return max_tokens if loaded.max_positions is None else min(max_tokens, loaded.max_positions)


def check_length(n_tokens: int, limit: int) -> None:
    """PromptError with both numbers when `n_tokens` exceeds `limit`."""
    if n_tokens > limit:
        raise PromptError(f"the prompt has {n_tokens} tokens; the limit is {limit}")


def encode_prompt(
    loaded: LoadedModel, prompt: str, max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
) -> Encoded:
    """Tokenize `prompt`; PromptError if empty or longer than the model or `max_tokens` allow."""
    if not prompt.strip():
        raise PromptError("the prompt is empty")
    tokenizer = loaded.tokenizer
    encoding = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=True)
    ids: list[int] = encoding["input_ids"]
    check_length(len(ids), token_limit(loaded, max_tokens))
    texts = [loaded.token_text(i) for i in ids]
    offsets = [(int(s), int(e)) for s, e in encoding["offset_mapping"]]
    return Encoded(torch.tensor(ids), offsets, texts)


def target_id(loaded: LoadedModel, prompt: str, target: str) -> tuple[int, list[str]]:
    """The first token of `target` as it would follow `prompt`, and warnings.

    A target that follows the prompt after a space is tokenized with that space (" foo"); a
    multi-token target is analysed through its first token, with a warning.
    """
    text = target if target[:1].isspace() or prompt[-1:].isspace() else " " + target
    ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise LabelError(f"the target {target!r} is empty after tokenization")
    warnings = []
    if len(ids) > 1:
        pieces = [loaded.token_text(i) for i in ids]
        warnings.append(
            f"the target {target!r} is {len(ids)} tokens {pieces}; its first token "
            f"{pieces[0]!r} is analysed"
        )
    return ids[0], warnings


def parse_head_names(names: list[str], n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """`L3H1` → (3, 1); LabelError for a malformed name or a head the model does not have."""
    try:
        return [model_head(name.strip(), n_layers, n_heads) for name in names]
    except ValueError as exc:
        raise LabelError(str(exc)) from None
