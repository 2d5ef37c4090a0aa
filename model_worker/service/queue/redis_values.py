"""Values read back from Redis, which answers bytes (or str, with decode_responses)."""

from __future__ import annotations

from typing import Any


def as_text(value: Any) -> str:
    """`value` as str: bytes decoded as UTF-8, anything else through str()."""
    return value.decode() if isinstance(value, bytes) else str(value)


def as_bytes(value: bytes | str) -> bytes:
    """`value` as bytes: str encoded as UTF-8."""
    return value if isinstance(value, bytes) else value.encode()
