"""How one token reads on its own: its decoded text, or, for a token that holds only part of a
character's UTF-8 bytes (byte-level BPE splits an emoji into several), those bytes as a readable
escape (`\\xf0\\x9f`) instead of the replacement character "\ufffd" that decoding it alone gives."""

from __future__ import annotations

from functools import cache
from typing import Any


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as the printable character its vocabularies use
    (printable Latin-1 bytes as themselves, the others shifted past U+0100)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


@cache
def _byte_of() -> dict[str, int]:
    """The byte each character of a byte-level BPE vocabulary stands for."""
    return {char: byte for byte, char in bytes_to_unicode().items()}


def readable_token(tokenizer: Any, token_id: int) -> str:
    """Token `token_id` as text: decoded, or its raw bytes with the undecodable ones escaped
    (byte-level vocabularies), or its vocabulary entry (SentencePiece's `<0xF0>`)."""
    text = str(tokenizer.decode([token_id]))
    if "\ufffd" not in text:
        return text
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if not isinstance(piece, str) or not piece:
        return text
    byte_of = _byte_of()
    if all(char in byte_of for char in piece):
        return bytes(byte_of[char] for char in piece).decode("utf-8", errors="backslashreplace")
    return piece
