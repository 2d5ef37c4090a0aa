"""How numbers and tokens read in figures, tables and hovers: signed values without a
negative zero, tokens with their whitespace made visible."""

from __future__ import annotations


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
