"""Tokens read as their characters: a byte-level token holding part of an emoji reads as its
bytes' escape, never as the replacement character; whole characters stay themselves."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

from model_worker.model.token_text import bytes_to_unicode, readable_token


def byte_level() -> PreTrainedTokenizerFast:
    """A byte-level BPE without merges (one token per byte) plus the whole word "猫"."""
    chars = list(bytes_to_unicode().values())
    vocab = {char: i for i, char in enumerate(chars)}
    whole = "".join(bytes_to_unicode()[b] for b in "猫".encode())
    vocab[whole[:2]] = len(vocab)
    vocab[whole] = len(vocab)
    merges = [(whole[0], whole[1]), (whole[:2], whole[2])]
    backend = Tokenizer(BPE(vocab, merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_partial_bytes_read_as_escapes_and_whole_characters_as_themselves() -> None:
    tokenizer = byte_level()
    emoji = tokenizer("😀", add_special_tokens=False)["input_ids"]
    shown = [readable_token(tokenizer, i) for i in emoji]
    assert shown == ["\\xf0", "\\x9f", "\\x98", "\\x80"] and "\ufffd" not in "".join(shown)
    (cat,) = tokenizer("猫", add_special_tokens=False)["input_ids"]
    assert readable_token(tokenizer, cat) == "猫"
    (letter,) = tokenizer("a", add_special_tokens=False)["input_ids"]
    assert readable_token(tokenizer, letter) == "a"
