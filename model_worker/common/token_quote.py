"""How a message quotes a token: once, without repr's doubled escapes."""

from __future__ import annotations


def quoted(token: str) -> str:
    """`token` in single quotes, each escape written once: a byte-level piece's `\\xd8` reads
    `'\\xd8'` (repr doubled it to `'\\\\xd8'`); a newline or a tab as its escape."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in token)
    return f"'{shown}'"
