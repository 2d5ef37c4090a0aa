"""How numbers and tokens read in figures, tables and hovers: signed values without a
negative zero, tokens with their whitespace made visible, and a prompt's byte-level pieces of
one character (an Arabic letter, an emoji) shown as that character."""

from __future__ import annotations

import re


def signed(value: float, digits: int = 3) -> str:
    """`+0.989` / `-0.120` / `+0.000`: a value rounding to zero never reads `-0.000`."""
    return f"{value:+z.{digits}f}"


def fixed(value: float, digits: int = 3) -> str:
    """`0.250` / `0.000`: an unsigned value, never `-0.000`."""
    return f"{value:z.{digits}f}"


def visible(token: str) -> str:
    """A token as shown on an axis: leading spaces as `␣`, newlines as `⏎`, tabs as `⇥`,
    never empty (`∅`)."""
    shown = token.replace("\n", "⏎").replace("\t", "⇥")
    stripped = shown.lstrip(" ")
    shown = "␣" * (len(shown) - len(stripped)) + stripped
    return shown or "∅"


def clip(text: str, limit: int = 16) -> str:
    """`text` cut to `limit` characters with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: a byte a token holds without a whole character: its escape as the engine writes it
#: (model_worker.model.token_text: `\xd8`) or a SentencePiece byte piece (`<0xD8>`)
_BYTE = re.compile(r"\\x([0-9a-f]{2})|<0x([0-9A-F]{2})>")
#: subscript digits: which piece of a character a token holds (ص₁ ص₂)
_SUB = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")


def _token_bytes(text: str) -> list[int]:
    """The bytes `text` stands for: its escapes as bytes, the rest as UTF-8."""
    found: list[int] = []
    at = 0
    for match in _BYTE.finditer(text):
        found += text[at : match.start()].encode()
        found.append(int(match.group(1) or match.group(2), 16))
        at = match.end()
    return found + list(text[at:].encode())


def _char_length(lead: int) -> int:
    """The length of the UTF-8 sequence a lead byte starts (0: not a lead byte)."""
    for length, (low, high) in enumerate(((0, 0x7F), (0xC2, 0xDF), (0xE0, 0xEF), (0xF0, 0xF4))):
        if low <= lead <= high:
            return length + 1
    return 0


def _decoded(data: list[int], at: int) -> tuple[str, int]:
    """The character of `data` starting at `at` and its length in bytes; a byte that starts no
    whole character is its escape, one byte long."""
    length = _char_length(data[at])
    if length and at + length <= len(data):
        try:
            return bytes(data[at : at + length]).decode("utf-8"), length
        except UnicodeDecodeError:
            pass
    return f"\\x{data[at]:02x}", 1


def joined_pieces(texts: list[str]) -> list[str]:
    """A prompt's token texts with each character that byte-level pieces split across tokens
    shown as itself in every piece, numbered (`\xd8`, `\xb5` → `ص₁`, `ص₂`): the token
    boundary stays, the text reads. A byte that forms no character keeps its escape; tokens
    without byte escapes are unchanged."""
    shown = list(texts)
    start = 0
    while start < len(texts):
        if not _BYTE.search(texts[start]):
            start += 1
            continue
        end = start
        while end < len(texts) and _BYTE.search(texts[end]):
            end += 1  # a run of tokens holding loose bytes: [start, end)
        data: list[int] = []
        owner: list[int] = []  # the token each byte of the run came from
        for i in range(start, end):
            piece = _token_bytes(texts[i])
            data += piece
            owner += [i] * len(piece)
        parts = {i: "" for i in range(start, end)}
        at = 0
        while at < len(data):
            char, length = _decoded(data, at)
            holders = list(dict.fromkeys(owner[at : at + length]))
            for k, i in enumerate(holders):
                parts[i] += char + (str(k + 1).translate(_SUB) if len(holders) > 1 else "")
            at += length
        shown[start:end] = [parts[i] for i in range(start, end)]
        start = end
    return shown


def shown_tokens(texts: list[str]) -> list[str]:
    """A prompt's tokens as figures and the token strip show them: pieces of a character
    joined (joined_pieces), whitespace made visible."""
    return [visible(text) for text in joined_pieces(texts)]
