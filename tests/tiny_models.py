"""Tiny random models built from configs, with a word-level tokenizer: GPT-2, Llama (GQA), and
one per registered family (`tiny_family`, from the spec's own tiny config).

No downloads: the tokenizer is built in memory, the weights are random and seeded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from model_worker.model.adapters import REGISTRY
from model_worker.model.loading import LoadedModel, wrap_model

#: Config keys of dropout probabilities across families (all zero in the tiny models).
DROPOUTS = (
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "attention_dropout",
    "hidden_dropout",
)

WORDS = [
    "[PAD]",
    "[UNK]",
    ":",
    "foo",
    "bar",
    "baz",
    "love",
    "like",
    "hate",
    "eight",
    "two",
    "one",
    "three",
    "four",
    "five",
    "good",
    "bad",
    "cat",
    "dog",
    "france",
    "spain",
    "->",
    "=",
    ".",
    ",",
    "!",
    "?",
    "the",
    "a",
    "is",
]
EXAMPLE_PROMPT = "love : bar like : bar eight : foo two : foo one :"


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A whitespace/punctuation word-level tokenizer over WORDS, with offsets."""
    vocab = {word: index for index, word in enumerate(WORDS)}
    backend = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")


def tiny_gpt2(seed: int = 0) -> LoadedModel:
    """GPT-2 family: LayerNorm, fused Conv1D qkv, learned positions, biases everywhere."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(WORDS),
        n_positions=64,
        n_embd=32,
        n_layer=3,
        n_head=4,
        attn_implementation="eager",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return wrap_model(GPT2LMHeadModel(config), word_tokenizer(), name="tiny-gpt2")


def tiny_llama(seed: int = 0) -> LoadedModel:
    """Llama family: RMSNorm, rotary, grouped-query attention (4 query heads on 2 K/V heads)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="eager",
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # random RMSNorm weights, so γ is not all ones in the tests
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return wrap_model(model, word_tokenizer(), name="tiny-llama")


def randomize_norms_and_biases(model: nn.Module, norm_offset: float) -> None:
    """Norm weights uniform in [0.5, 1.5] as the model applies them (γ + offset), random norm
    and projection biases: identities must not pass only because γ = 1 or b = 0."""
    with torch.no_grad():
        for module in model.modules():
            weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
            if "norm" in type(module).__name__.lower() and isinstance(weight, torch.Tensor):
                weight.uniform_(0.5, 1.5).sub_(norm_offset)
            if isinstance(bias, torch.Tensor) and bias.requires_grad:
                bias.normal_(0.0, 0.1)


def tiny_family(
    family: str,
    seed: int = 0,
    overrides: Mapping[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
) -> LoadedModel:
    """A tiny random checkpoint (fp32 unless `dtype`) of a registered family, from its spec's
    `tiny` config with `overrides` (one of its `configurations`, say)."""
    spec = REGISTRY[family]
    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        family,
        vocab_size=len(WORDS),
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        **{**spec.tiny, **(overrides or {})},
        **{k: 0.0 for k in DROPOUTS},
    )
    for key, value in (overrides or {}).items():  # a boolean switch some versions' config
        if isinstance(value, bool) and getattr(config, key, None) is not value:  # classes drop
            setattr(config, key, value)  # (Phi's and StableLM's qk_layernorm)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype)
    randomize_norms_and_biases(model, spec.norm_offset)
    return wrap_model(model, word_tokenizer(), name=f"tiny-{family}")
