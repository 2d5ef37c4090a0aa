"""Prompts of about 12, 66 and 300 tokens from the built-in datasets' words, and a tiny random
Llama whose word-level vocabulary holds them (plus an emoji and a CJK word): what the figure
tests draw at every prompt length without a real model."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from model_worker.datasets.builtin import read_word_list
from model_worker.datasets.prompts import format_prompt
from model_worker.model.loading import LoadedModel, wrap_model

#: words outside the datasets that the figures must show as themselves
EXTRA = ("😀", "猫", "café")
CLASSES = ("sentiment", "number", "animal", "country")


def _words(name: str) -> list[str]:
    return [w for w in read_word_list(name) if w.isalpha()]


def vocabulary() -> list[str]:
    """The tokenizer's words: specials, the separator and labels, EXTRA, the datasets' words."""
    words = ["[PAD]", "[UNK]", ":", "foo", "bar", *EXTRA]
    for name in CLASSES:
        words += [w for w in _words(name) if w not in words]
    return words


def tiny_words(seed: int = 0) -> LoadedModel:
    """A 6-layer, 4-head random Llama over `vocabulary()`, 1,024 positions."""
    words = vocabulary()
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]"
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(words),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        attn_implementation="eager",
        tie_word_embeddings=False,
    )
    return wrap_model(LlamaForCausalLM(config), tokenizer, name="tiny-words")


def prompt(n_tokens: int) -> str:
    """A sentiment (foo) / number (bar) prompt of at most `n_tokens` word tokens: `word : label`
    demonstrations, one of them an emoji and one a CJK word, then the query `word :`."""
    positive, numbers = _words("sentiment"), _words("number")
    demos: list[tuple[str, str]] = []
    while 3 * (len(demos) + 1) + 2 <= n_tokens:
        i = len(demos)
        word = (positive if i % 2 else numbers)[i // 2 % min(len(positive), len(numbers))]
        word = {3: EXTRA[0], 6: EXTRA[1]}.get(i, word)
        demos.append((word, "foo" if i % 2 else "bar"))
    return format_prompt(demos, positive[-1])
